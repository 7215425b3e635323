-- Commit an alert evaluation: replace the state and gauge hashes and stamp the time, but only if
-- the evaluation lock is still ours (an evaluation that outlived its lock changes nothing).
-- KEYS[1] lock  KEYS[2] state hash  KEYS[3] gauges hash  KEYS[4] evaluated (time stamp)
-- ARGV[1] lock token  ARGV[2] now (ms)  ARGV[3] number of states, then name/JSON pairs of the
-- states, then name/JSON pairs of the gauges
-- Returns 1 if committed, 0 if the lock was lost.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
local n = tonumber(ARGV[3])
local function put(key, from, to)
  for i = from, to, 1000 do
    redis.call('HSET', key, unpack(ARGV, i, math.min(i + 999, to)))
  end
end
put(KEYS[2], 4, 3 + 2 * n)
put(KEYS[3], 4 + 2 * n, #ARGV)
redis.call('SET', KEYS[4], ARGV[2])
return 1
