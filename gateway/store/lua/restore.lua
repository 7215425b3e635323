-- Seed a consumer's committed offsets from the broker's checkpoint (core/checkpoint.py), after
-- choose.lua answered {5}: a queue of this topic had no committed offset and the checkpoint was
-- never consulted for it (a new consumer, or a Redis that lost its data).
-- Only queues that still have no committed offset are seeded (HSETNX), so a concurrent restore
-- on another node, or a reset in between, is never undone; the marker  t:ckpt  is set either way
-- so that queues the checkpoint does not know start at the consumer's `start` position.
-- KEYS[1] consumer hash  ARGV[1] topic  ARGV[2] now (ms)  ARGV[3..] pairs: queue id, offset
-- Returns how many queues were seeded.
local key, topic = KEYS[1], ARGV[1]
local seeded = 0
for i = 3, #ARGV, 2 do
  local p = topic .. ':' .. ARGV[i] .. ':'
  if redis.call('HSETNX', key, p .. 'com', ARGV[i + 1]) == 1 then
    redis.call('HSET', key, p .. 'ckp', ARGV[i + 1])  -- what the broker holds already
    seeded = seeded + 1
  end
end
redis.call('HSET', key, topic .. ':ckpt', ARGV[2])
return seeded
