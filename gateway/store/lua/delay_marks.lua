-- Cancel and deliver of delayed records decide here, so the two never both win. Only a cancel
-- leaves a mark: a delivered record leaves nothing in Redis (a mark per delivered record, kept
-- for days, grew Redis by ~945,000 keys an hour under a steady 200 delayed records/s). Instead a
-- cancel is refused from `cutoff` ms before the record's due time on, by Redis' clock (the
-- prelude's clock_ms): the relay delivers a record at its due time, so a cancel that is not
-- refused came before the relay's check, and the relay sees its mark.
-- A relay whose clock runs ahead of Redis' by more than the cutoff would deliver before the
-- cancel window closed: for that case alone it writes 'd', kept until the due time.
--
-- cancel (one key):  ARGV = 'cancel', due (ms), cutoff (ms), the mark's expiry (unix ms)
--                    returns 'cancelled', 'already_cancelled', 'delivered' or 'too_late'
--                    (store/delay.py: CancelOutcome)
-- deliver (a batch): KEYS[i] the mark of record i; ARGV = 'deliver', cutoff (ms), then the due
--                    time of record i at ARGV[2 + i]. Returns the indexes (1-based) of the
--                    cancelled records, which the relay drops.
if ARGV[1] == 'cancel' then
  local mark = redis.call('GET', KEYS[1])
  if mark == 'c' then return 'already_cancelled' end
  if mark == 'd' then return 'delivered' end
  if clock_ms() >= tonumber(ARGV[2]) - tonumber(ARGV[3]) then return 'too_late' end
  redis.call('SET', KEYS[1], 'c', 'PXAT', ARGV[4])
  return 'cancelled'
end
local cutoff, now = tonumber(ARGV[2]), clock_ms()
local dropped = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == 'c' then
    dropped[#dropped + 1] = i
  else
    local due = tonumber(ARGV[2 + i])
    if now < due - cutoff then redis.call('SET', KEYS[i], 'd', 'PXAT', due) end
  end
end
return dropped
