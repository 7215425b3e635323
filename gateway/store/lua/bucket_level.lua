-- Report a consumer's rate-limit bucket refilled to Redis' time, writing nothing (for mqgw
-- snapshot): the prelude's refill, exactly as choose.lua would see the bucket now.
-- KEYS[1] consumer config hash  KEYS[2] rate-limit bucket
-- Returns the tokens as a string (a Lua number reply would be cut to an integer), or nil when the
-- consumer has no rate limit.
local cfg = redis.call('HMGET', KEYS[1], 'rate', 'burst')
local rate = tonumber(cfg[1])
if not rate or rate <= 0 then return false end
local tokens = refill(KEYS[2], rate, bucket_burst(rate, cfg[2]))
return string.format('%.17g', tokens)
