-- Raise the bound of a lock's batch (`out`) to the batch's real end, when its offsets span more
-- than the records it was allowed: transaction markers and aborted records (the delay relay's
-- exactly-once hops write them into users' topics), compaction, holes. choose.lua sets `out` to
-- the batch's start plus its allowance, counting one offset a record, and flags batches below
-- an expired lock's `out`; a batch that really went further would leave its tail unflagged when
-- a smaller fetch took the queue over. Called only for such batches (core/fetch.py), before the
-- answer. If another fetch took the queue since (a later token), the old bound has already been
-- folded into `rdl`: the mark itself is raised.
-- KEYS[1] consumer hash  ARGV[1] field prefix 'topic:queue:'  ARGV[2] lock token  ARGV[3] end
-- Returns 1 (raised or already that high), 0 (no such queue).
local key, p, token, last = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', key, p .. 'tok', p .. 'out', p .. 'rdl')
if not v[1] then return 0 end
if tonumber(v[1]) == token then
  if last > (tonumber(v[2]) or 0) then redis.call('HSET', key, p .. 'out', last) end
elseif last > (tonumber(v[3]) or 0) then
  redis.call('HSET', key, p .. 'rdl', last)
end
return 1
