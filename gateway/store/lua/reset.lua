-- Move committed offsets (an operator's reset), in one round trip per consumer key.
-- Each reset queue's lock is dropped and its token bumped, and the new token is remembered as
-- rtok: acks of batches fetched before the reset (tokens <= rtok) answer 'offset_reset' and
-- change nothing, so an in-flight batch can never commit over the new position.
-- A broadcast clientId's hash expires when idle (choose.lua); one this reset creates gets the same
-- idle ttl, or it would live for ever.
-- KEYS[1] consumer hash  ARGV[1] topic  ARGV[2] idle ttl (ms) for a hash without one, 0 for none
-- ARGV[3..] pairs: queue id, new committed offset
-- Returns a flat list: queue, previous committed offset (-1 if the queue was unknown), new offset
local key, topic = KEYS[1], ARGV[1]
local out = {}
for i = 3, #ARGV, 2 do
  local p = topic .. ':' .. ARGV[i] .. ':'
  local old = tonumber(redis.call('HGET', key, p .. 'com')) or -1
  seed_token(key, p .. 'tok')  -- as in choose.lua: tokens never repeat
  local tok = redis.call('HINCRBY', key, p .. 'tok', 1)
  local new = tonumber(ARGV[i + 1])
  -- tok as a string: large tokens would be written as 1.79e+15 from a Lua number
  redis.call('HSET', key, p .. 'com', new, p .. 'lock', 0, p .. 'rtok', string.format('%d', tok))
  local mx = tonumber(redis.call('HGET', key, p .. 'max')) or 0
  if new > mx then redis.call('HSET', key, p .. 'max', new) end
  out[#out + 1] = ARGV[i]
  out[#out + 1] = old
  out[#out + 1] = new
end
ix_drop(key, topic)  -- many queues moved: choose.lua rebuilds the indexes
local ttl = tonumber(ARGV[2])
if ttl > 0 and redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, ttl) end
return out
