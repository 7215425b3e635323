-- Commit an alert evaluation: replace the state and gauge hashes and stamp the time, but only if
-- the evaluation lock is still ours (an evaluation that outlived its lock changes nothing).
-- KEYS[1] lock  KEYS[2] state hash  KEYS[3] gauges hash  KEYS[4] evaluated (time stamp)
-- ARGV[1] lock token  ARGV[2] now (ms)  ARGV[3] number of states, then name/JSON pairs of the
-- states, then name/JSON pairs of the gauges
-- Returns 1 if committed, 0 if the lock was lost.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
local n = tonumber(ARGV[3])
hset_pairs(KEYS[2], ARGV, 4, 3 + 2 * n)
hset_pairs(KEYS[3], ARGV, 4 + 2 * n, #ARGV)
redis.call('SET', KEYS[4], ARGV[2])
return 1
