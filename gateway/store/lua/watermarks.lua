-- Read a topic's cached watermarks and, if they are stale, try to take the refresh lease, in one
-- round trip. The lease (SET NX PX) lets exactly one node per interval ask the broker.
-- KEYS[1] watermark hash  KEYS[2] lease key  ARGV[1] now (ms)  ARGV[2] refresh interval (ms)  ARGV[3] node id
-- Returns {got_lease (0/1), flat hash contents}
local now, refresh = tonumber(ARGV[1]), tonumber(ARGV[2])
local data = redis.call('HGETALL', KEYS[1])
local ts = 0
for i = 1, #data, 2 do
  if data[i] == 'ts' then ts = tonumber(data[i + 1]) end
end
local lease = 0
if now - ts >= refresh and redis.call('SET', KEYS[2], ARGV[3], 'PX', refresh, 'NX') then lease = 1 end
return {lease, data}
