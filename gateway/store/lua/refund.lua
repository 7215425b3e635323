-- Give back rate-limit tokens a batch was charged for but did not deliver. choose.lua charges the
-- allowance up front (so the common case costs no second call); a read can come back shorter:
-- records of an open transaction are not readable yet, compaction and transaction markers leave
-- holes, a queue can turn out empty. Without the refund those tokens would be lost, and a queue
-- that keeps reading short would starve the others.
-- KEYS[1] rate-limit bucket  KEYS[2] consumer config hash  ARGV[1] tokens to give back
-- Returns the bucket's tokens after the refund, or -1 if the consumer has no rate limit now.
local cfg = redis.call('HMGET', KEYS[2], 'rate', 'burst')
local rate = tonumber(cfg[1])
if not rate or rate <= 0 then return -1 end
local burst = bucket_burst(rate, cfg[2])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
if tokens == nil then return -1 end  -- the bucket expired: it is full again anyway
tokens = math.min(burst, tokens + tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'tokens', tokens)
return math.floor(tokens)
