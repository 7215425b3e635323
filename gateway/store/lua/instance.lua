-- A REST v2 consumer instance's hash (store/instances.py): make it, or change it while it lives.
-- Either way its expiry starts again: an instance nobody calls goes after the instance timeout.
-- KEYS[1] the instance hash
-- ARGV[1] 'create' | 'update'  ARGV[2] expiry (ms)
-- ARGV[3] the settings' version ('v') the caller decided on ('' : any)
-- ARGV[4] pending batches kept at most (0: no limit): beyond it the oldest go (their locks ran
--         out long ago: redelivered, nothing lost)
-- ARGV[5] n, fields to delete  ARGV[6 .. 5+n] those fields, then field, value pairs to set
-- Returns 1 if done; 0 if 'create' found the instance there, or 'update' found it gone (deleted
-- or expired: nothing is written, so a stale call cannot bring back half an instance); 2 if
-- 'update' found other settings than ARGV[3] (a subscription changed meanwhile: nothing written).
local exists = redis.call('EXISTS', KEYS[1]) == 1
if (ARGV[1] == 'create') == exists then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'v') ~= ARGV[3] then return 2 end
local n = tonumber(ARGV[5])
if n > 0 then redis.call('HDEL', KEYS[1], unpack(ARGV, 6, 5 + n)) end
if #ARGV > 5 + n then redis.call('HSET', KEYS[1], unpack(ARGV, 6 + n)) end
local cap = tonumber(ARGV[4])
if cap > 0 and redis.call('HLEN', KEYS[1]) > cap then
  local h, b = redis.call('HGETALL', KEYS[1]), {}
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'b:' then b[#b + 1] = {tonumber(string.match(h[i + 1], '^%d+')), h[i]} end
  end
  if #b > cap then
    table.sort(b, function(x, y) return x[1] < y[1] end)
    for i = 1, #b - cap do redis.call('HDEL', KEYS[1], b[i][2]) end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
