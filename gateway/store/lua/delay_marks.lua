-- Cancel and deliver of delayed records decide on one mark per record, so the two never both win
-- (whatever the nodes' clocks say): 'c' cancelled, 'd' delivered, expiring at ARGV's time.
--
-- ARGV[1] 'cancel' | 'deliver'; KEYS[i] the mark of record i; ARGV[1 + i] its expiry (unix ms)
-- cancel (one key):  returns 'cancelled' (also when it already was) or 'delivered'
-- deliver (a batch): marks every record not cancelled as delivered; returns the indexes (1-based)
--                    of the cancelled ones, which the relay drops
if ARGV[1] == 'cancel' then
  if redis.call('GET', KEYS[1]) == 'd' then return 'delivered' end
  redis.call('SET', KEYS[1], 'c', 'PXAT', ARGV[2])
  return 'cancelled'
end
local dropped = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == 'c' then
    dropped[#dropped + 1] = i
  else
    redis.call('SET', KEYS[i], 'd', 'PXAT', ARGV[1 + i])
  end
end
return dropped
