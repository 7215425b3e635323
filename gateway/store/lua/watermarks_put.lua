-- Store freshly listed watermarks; each one only moves forward (ListOffsets may lag a fetch).
-- KEYS[1] watermark hash  ARGV[1] now (ms)  ARGV[2] comma-separated queue ids  ARGV[3..] triples id, lo, hi
-- Returns 1.
local key = KEYS[1]
local writes = {'ts', ARGV[1], 'queues', ARGV[2]}
for i = 3, #ARGV, 3 do
  local q = ARGV[i]
  local old = redis.call('HMGET', key, q .. ':lo', q .. ':hi')
  local lo, hi = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if old[1] and tonumber(old[1]) > lo then lo = tonumber(old[1]) end
  if old[2] and tonumber(old[2]) > hi then hi = tonumber(old[2]) end
  writes[#writes + 1] = q .. ':lo'
  writes[#writes + 1] = lo
  writes[#writes + 1] = q .. ':hi'
  writes[#writes + 1] = hi
end
hset_pairs(key, writes)
return 1
