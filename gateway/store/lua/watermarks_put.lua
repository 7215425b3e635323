-- Store freshly listed watermarks; each one only moves forward (ListOffsets may lag a fetch).
-- KEYS[1] watermark hash  KEYS[2] its change index (zset: queue -> the version it last moved at)
-- ARGV[1] now (ms)  ARGV[2] comma-separated queue ids  ARGV[3..] triples id, lo, hi (the caller
-- sends only queues ahead of the copy it read: store/offsets.py)
-- The copy has a version (`ver`), raised by a write that moved anything; the queues each
-- version moved are in KEYS[2], so a reader that holds version v reads only what moved after it
-- (watermarks.lua). `vts` is the `ts` of the last versioned write: a `ts` that differs was written
-- by a gateway that keeps no versions (a rolling upgrade), and readers read the whole copy.
-- Returns {the version before this write ('' for none), the version after it}.
local key, changes = KEYS[1], KEYS[2]
local head = redis.call('HMGET', key, 'ver', 'queues', 'ts', 'vts')
local ver = (tonumber(head[1]) or 0) + 1
-- Written without a version since the last versioned write (a gateway before versions, during a
-- rolling upgrade): what it moved is in no change index, so this version counts every queue as
-- moved, or a reader that held a version from before both writes would never read it.
local unversioned = head[3] and head[3] ~= head[4]
local writes = {'ts', ARGV[1], 'vts', ARGV[1]}
local moved = {}
for i = 3, #ARGV, 3 do
  local q = ARGV[i]
  local old = redis.call('HMGET', key, q .. ':lo', q .. ':hi')
  local lo, hi = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if old[1] and tonumber(old[1]) > lo then lo = tonumber(old[1]) end
  if old[2] and tonumber(old[2]) > hi then hi = tonumber(old[2]) end
  if lo ~= tonumber(old[1]) or hi ~= tonumber(old[2]) then
    writes[#writes + 1] = q .. ':lo'
    writes[#writes + 1] = lo
    writes[#writes + 1] = q .. ':hi'
    writes[#writes + 1] = hi
    moved[#moved + 1] = ver
    moved[#moved + 1] = q
  end
end
if head[2] ~= ARGV[2] then
  writes[#writes + 1] = 'queues'
  writes[#writes + 1] = ARGV[2]
  writes[#writes + 1] = 'qver'
  writes[#writes + 1] = ver
  moved[#moved + 1] = ver  -- a version of its own even if no watermark moved
  moved[#moved + 1] = ''
end
if unversioned then
  for q in string.gmatch(ARGV[2], '[^,]+') do
    moved[#moved + 1] = ver
    moved[#moved + 1] = q
  end
end
if #moved > 0 then
  writes[#writes + 1] = 'ver'
  writes[#writes + 1] = ver
  for i = 1, #moved, SLICE do
    redis.call('ZADD', changes, unpack(moved, i, math.min(i + SLICE - 1, #moved)))
  end
end
hset_pairs(key, writes)
if #moved > 0 then return {head[1] or '', ver} end
return {head[1] or '', head[1] or ''}
