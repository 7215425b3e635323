-- Commit a batch, in one round trip. Only the fetch that holds the queue's current lock token may
-- commit, and only when the committed offset still equals the batch's start offset. An expired
-- lock that nobody took since still has our token, so a late ack commits.
--
-- KEYS[1] consumer hash  KEYS[2] consumer config hash  KEYS[3] consumer's API-key grants
-- ARGV[1] field prefix 'topic:queue:'  ARGV[2] batch offset  ARGV[3] next offset  ARGV[4] lock token
-- ARGV[5] now (ms)  ARGV[6] default consume timeout (ms)  ARGV[7] high watermark seen (-1 if none)
-- ARGV[8] auth '1'|'0'  ARGV[9] key id  ARGV[10] key sha256 (hex)
-- ARGV[11] '1': only check (a nack asks before it writes the failed records anywhere): the
--          result is what an ack would do now, and nothing is committed
-- Returns {result, committed offset, lock state} (store/offsets.py: AckOutcome, LockState: held |
-- expired | released for a commit, '' otherwise) with result one of
--   committed | already_committed | lock_lost | offset_reset | offset_mismatch | unknown | unauthorized
-- ('offset_reset': an operator reset the queue after this batch was fetched; rtok is the lock
-- token a reset left behind, so every batch fetched before it has a token <= rtok).
if ARGV[8] == '1' and not granted(KEYS[3], ARGV[9], ARGV[10]) then return {'unauthorized', -1, ''} end
return ack_batch(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
                 tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[11] == '1')
