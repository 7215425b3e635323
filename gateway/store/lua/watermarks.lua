-- Read a topic's cached watermarks and, if they are stale, try to take the refresh lease, in one
-- round trip. The lease (SET NX PX) lets exactly one node per interval ask the broker.
-- KEYS[1] watermark hash  KEYS[2] lease key  KEYS[3] the copy's change index (watermarks_put.lua)
-- ARGV[1] now (ms)  ARGV[2] refresh interval (ms)  ARGV[3] node id
-- ARGV[4] the version of the copy the caller holds ('' for none)
-- Returns {got_lease (0/1), 'full', version ('' for none), flat hash contents}, or, to a caller
-- whose version the change index still covers, only what moved after it:
--   {got_lease, 'delta', version, ts, queues ('' when the list did not change), then triples
--    queue, lo, hi}
-- (a read of the whole copy of 4,096 queues cost 2.7 ms, every 200 ms in every process).
local now, refresh = tonumber(ARGV[1]), tonumber(ARGV[2])
local head = redis.call('HMGET', KEYS[1], 'ts', 'ver', 'vts', 'qver', 'queues')
local ts = tonumber(head[1]) or 0
local lease = 0
if now - ts >= refresh and redis.call('SET', KEYS[2], ARGV[3], 'PX', refresh, 'NX') then lease = 1 end
local known = tonumber(ARGV[4])
if known and head[2] and head[1] == head[3] and known <= tonumber(head[2]) then
  local out = {lease, 'delta', head[2], head[1], ''}
  if (tonumber(head[4]) or 0) > known then out[5] = head[5] end
  for _, q in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. known, '+inf')) do
    if q ~= '' then
      local v = redis.call('HMGET', KEYS[1], q .. ':lo', q .. ':hi')
      out[#out + 1] = q
      out[#out + 1] = v[1] or 0
      out[#out + 1] = v[2] or 0
    end
  end
  return out
end
return {lease, 'full', head[2] or '', redis.call('HGETALL', KEYS[1])}
