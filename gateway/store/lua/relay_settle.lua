-- The relay's settle of a level-topic queue it holds (core/relay.py), in one round trip: commit
-- what it forwarded and either free the queue or keep it locked until its head is due ("park"),
-- so that no relay reads it again before then and choose.lua reports that time as the queue's
-- wake-up. Parking is the lock itself, dated so that it expires at the head's due time: a relay
-- that dies holds nothing in memory and loses nothing.
--
-- KEYS[1] the relay's queue hash
-- ARGV[1] field prefix 'topic:queue:'  ARGV[2] batch offset  ARGV[3] next offset (= ARGV[2]: none
-- forwarded)  ARGV[4] lock token  ARGV[5] park until (ms, 0: free the queue)  ARGV[6] the relay's
-- lock timeout (ms)
-- Returns {result, committed}: settled | lock_lost | offset_mismatch | unknown (store/delay.py:
-- Settled)
local key, p = KEYS[1], ARGV[1]
local v = redis.call('HMGET', key, p .. 'com', p .. 'tok')
local com = tonumber(v[1])
if com == nil then return {'unknown', -1} end
if (tonumber(v[2]) or 0) ~= tonumber(ARGV[4]) then return {'lock_lost', com} end
if com ~= tonumber(ARGV[2]) then return {'offset_mismatch', com} end
local nxt, park = tonumber(ARGV[3]), tonumber(ARGV[5])
local lock = 0
if park > 0 then lock = park - tonumber(ARGV[6]) end
redis.call('HSET', key, p .. 'com', nxt, p .. 'lock', lock)
ix_place(key, p)  -- parked: in the lock index until its head is due; freed: ready if it has more
return {'settled', nxt}
