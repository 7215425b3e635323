-- Delete a lease or lock only if it still holds our token (another holder's is left alone).
-- KEYS[1] lease or lock key  ARGV[1] our token (node id or evaluation token)
-- Returns 1 if deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
