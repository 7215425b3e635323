-- Extend a fetched batch's lock for a long handler: the consumer's lock timeout starts again now.
-- Only the fetch that holds the queue's current lock token may extend it, while its batch is still
-- uncommitted at its start offset (the checks ack.lua makes, in the same order: prelude's
-- batch_refusal) and locked: a batch handed back with /unlock is not locked again. An expired
-- lock that nobody took since still has our token, so a late extend holds the queue again, as a
-- late ack commits.
--
-- KEYS[1] consumer hash  KEYS[2] consumer config hash  KEYS[3] consumer's API-key grants
-- ARGV[1] field prefix 'topic:queue:'  ARGV[2] batch offset  ARGV[3] next offset  ARGV[4] lock token
-- ARGV[5] now (ms)  ARGV[6] default consume timeout (ms)
-- ARGV[7] auth '1'|'0'  ARGV[8] key id  ARGV[9] key sha256 (hex)
-- Returns {result, committed offset, lock timeout ms (0 unless extended)} (store/offsets.py:
-- ExtendOutcome) with result one of
--   extended | already_committed | lock_lost | offset_reset | offset_mismatch | not_locked |
--   unknown | unauthorized
local key, p = KEYS[1], ARGV[1]
if ARGV[7] == '1' and not granted(KEYS[3], ARGV[8], ARGV[9]) then return {'unauthorized', -1, 0} end
local refusal, com, lock = batch_refusal(key, p, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
if refusal then return {refusal, com, 0} end
if lock == 0 then return {'not_locked', com, 0} end
redis.call('HSET', key, p .. 'lock', ARGV[5])
ix_place(key, p)
return {'extended', com, lock_timeout(KEYS[2], ARGV[6])}
