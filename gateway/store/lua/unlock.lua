-- Release a lock early so the batch is redelivered at once. Only the current token may release.
-- KEYS[1] consumer hash  KEYS[2] consumer's API-key grants
-- ARGV[1] field prefix  ARGV[2] lock token  ARGV[3] high watermark (-1 if none)
-- ARGV[4] auth '1'|'0'  ARGV[5] key id  ARGV[6] key sha256 (hex)
-- ARGV[7] the end (next offset) of the batch handed out under this lock, -1 if none was (a read
--         that failed or came back empty gives its lock back): the handed-out mark `rdl` rises to
--         it, so the batch comes back flagged redelivered (choose.lua), also a shorter one
-- Returns {result, committed offset}: unlocked | not_locked | lock_lost | unknown | unauthorized
-- (store/offsets.py: UnlockOutcome)
local key, p = KEYS[1], ARGV[1]
if ARGV[4] == '1' and not granted(KEYS[2], ARGV[5], ARGV[6]) then return {'unauthorized', -1} end
local v = redis.call('HMGET', key, p .. 'com', p .. 'tok', p .. 'lock', p .. 'max', p .. 'rdl')
local com = tonumber(v[1])
if com == nil then return {'unknown', -1} end
local hw = tonumber(ARGV[3])
if hw > (tonumber(v[4]) or 0) then redis.call('HSET', key, p .. 'max', hw) end
if (tonumber(v[2]) or 0) ~= tonumber(ARGV[2]) then return {'lock_lost', com} end
if (tonumber(v[3]) or 0) == 0 then return {'not_locked', com} end
local handed = tonumber(ARGV[7])
if handed > (tonumber(v[5]) or 0) then
  redis.call('HSET', key, p .. 'lock', 0, p .. 'rdl', handed)
else
  redis.call('HSET', key, p .. 'lock', 0)
end
ix_place(key, p)
return {'unlocked', com}
