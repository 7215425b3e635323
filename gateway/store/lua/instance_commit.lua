-- Commit every pending batch of a REST v2 instance (store/instances.py), in one round trip: each
-- is acked by ack.lua's rule (prelude ack_batch), then dropped from the instance, whose expiry
-- starts again. A pending batch's field is 'b:<requestId>', its value what the fetch wrote:
-- '<fetched ms> <topic> <queue> <offset> <next offset> <token> <high watermark>' (names of
-- topics and queue ids hold no space).
--
-- KEYS[1] the instance hash  KEYS[2] consumer hash  KEYS[3] consumer config hash
-- KEYS[4] consumer's API-key grants
-- ARGV[1] expiry (ms)  ARGV[2] now (ms)  ARGV[3] default consume timeout (ms)
-- ARGV[4] auth '1'|'0'  ARGV[5] key id  ARGV[6] key sha256 (hex)
-- Returns {'gone'} (no such instance), {'unauthorized'}, or {'ok', then per batch: requestId,
-- topic, queue, offset, result, committed offset, lock state}; result 'legacy' for a batch
-- whose value holds only its time (left pending: the caller acks it by its requestId).
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
if ARGV[4] == '1' and not granted(KEYS[4], ARGV[5], ARGV[6]) then return {'unauthorized'} end
local now = tonumber(ARGV[2])
local h = redis.call('HGETALL', KEYS[1])
local out = {'ok'}
for i = 1, #h, 2 do
  local f = h[i]
  if string.sub(f, 1, 2) == 'b:' then
    local v = {}
    for w in string.gmatch(h[i + 1], '%S+') do v[#v + 1] = w end
    if #v == 7 then
      local topic, queue, off = v[2], v[3], tonumber(v[4])
      local r = ack_batch(KEYS[2], KEYS[3], topic .. ':' .. queue .. ':', off, tonumber(v[5]),
                          tonumber(v[6]), now, ARGV[3], tonumber(v[7]), false)
      redis.call('HDEL', KEYS[1], f)
      for _, x in ipairs({string.sub(f, 3), topic, queue, off, r[1], r[2], r[3]}) do
        out[#out + 1] = x
      end
    else  -- written by a gateway before 2026-11-28 (its value: only when): left to the caller
      for _, x in ipairs({string.sub(f, 3), '', '', -1, 'legacy', -1, ''}) do out[#out + 1] = x end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return out
