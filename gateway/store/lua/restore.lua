-- Seed a consumer's committed offsets, after choose.lua answered {5}: a queue of this topic had
-- no committed offset (a new consumer or queue, or a Redis that lost its data). The caller gives
-- each queue's position as the broker's checkpoint holds it: read from there, or, for a queue the
-- checkpoint lacked, the start position it has just written there (core/checkpoint.py).
-- Only queues that still have no committed offset are seeded (HSETNX), so a concurrent restore
-- on another node, or a reset in between, is never undone.
-- A queue resumed from the checkpoint may hand out again records it delivered before Redis was
-- lost, and the locks that would flag them went with Redis: `rdl` (the queue's high watermark at
-- the restore, > 0) makes every batch below it `redelivered` (choose.lua returns it).
-- Unless the broker's position is a start another node's restore has just written there and
-- not seeded yet: that node noted it in `sta` first (store.note_starts), so an equal `sta` means
-- this Redis was not lost and nothing was delivered from the queue (two nodes' first polls at
-- once flagged all 504 batches of a fault-free run on RocketMQ otherwise). `sta` is dropped here.
-- KEYS[1] consumer hash  ARGV[1] topic  ARGV[2..] triples: queue id, offset, rdl (0: none)
-- Returns how many queues were seeded.
local key, topic = KEYS[1], ARGV[1]
local seeded = 0
for i = 2, #ARGV, 3 do
  local p = topic .. ':' .. ARGV[i] .. ':'
  local offset, rdl = ARGV[i + 1], tonumber(ARGV[i + 2])
  if redis.call('HSETNX', key, p .. 'com', offset) == 1 then
    redis.call('HSET', key, p .. 'ckp', offset)  -- what the broker holds already
    if rdl > 0 and redis.call('HGET', key, p .. 'sta') ~= offset then
      redis.call('HSET', key, p .. 'rdl', rdl)
    end
    seeded = seeded + 1
  end
  redis.call('HDEL', key, p .. 'sta')
end
if seeded > 0 then ix_drop(key, topic) end  -- choose.lua rebuilds the indexes
return seeded
