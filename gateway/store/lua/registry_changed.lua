-- A registry write that can change a produce verdict happened (store/changes.py): bump the
-- version and publish it, in one call, so the notice carries the version its acks are kept under.
-- KEYS[1] version counter  ARGV[1] channel
-- Returns {version, number of subscribers the notice reached}
local v = redis.call('INCR', KEYS[1])
return {v, redis.call('PUBLISH', ARGV[1], v)}
