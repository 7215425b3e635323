-- Check the caller and choose and lock one queue for a consumer, in one round trip.
--
-- KEYS[1] consumer hash  KEYS[2] consumer config hash  KEYS[3] broadcast client registry (zset)
-- KEYS[4] consumer's API-key grants (hash key id -> sha256)  KEYS[5] rate-limit bucket (hash)
-- ARGV[1] topic  ARGV[2] now (ms)  ARGV[3] default consume timeout (ms)  ARGV[4] default start
-- ARGV[5] client address  ARGV[6] clientId ('' in cluster mode)  ARGV[7] client idle ttl (ms)
-- ARGV[8] queues to skip, as ',q1,q2,' ('' for none)  ARGV[9] batch size asked for
-- ARGV[10] open mode '1'|'0'  ARGV[11] auth '1'|'0'  ARGV[12] key id  ARGV[13] key sha256 (hex)
-- ARGV[14] '1': a queue with no committed offset is never given one here but asks the caller to
--          restore it (cluster mode): from the broker's checkpoint, or its start position written
--          to the checkpoint first, so that a Redis lost even before the first checkpoint round
--          loses no position (restore.lua)
-- ARGV[15] the topic a registration must name: ARGV[1] itself, or for a consumer's retry topic
--          the topic whose failures it holds
-- ARGV[16] 'full': the triples are every queue of the topic (the scan below, which also
--          rebuilds the indexes); 'delta': only the queues whose watermarks changed after version
--          ARGV[18] of the sender's copy (the indexed path, in time independent of the queues)
-- ARGV[17] the sender's watermark copy ('' for none: a full request that records nothing)
-- ARGV[18] the version of that copy the deltas start after  ARGV[19] the copy's version now
-- ARGV[20] rebuild the indexes from the hash when they are older than this (ms)
-- ARGV[21] the consumer's shard count as the caller knows it (store/shards.py)
-- ARGV[22..] triples: queue id, low watermark, high watermark
--
-- Per queue q of topic t the hash holds  t:q:max  t:q:com  t:q:lock  t:q:tok  t:q:acc  t:q:addr
-- (and t:q:ckp: core/checkpoint.py; t:q:rdl, how far the queue may have been handed out, and
-- t:q:out, the bound of the current lock's batch: see below),
-- and once per hash  poll  (the time of the last accepted /message), once per topic  t:era  (the
-- Redis process that chose last: see below).
-- max never goes down; com starts at the latest (or earliest) offset; a lock is free when 0 or older
-- than the consume timeout; every lock increments tok so stale acks can be told apart.
-- Returns one of (the first element is store/offsets.py's Chosen; a refusal's reason, Refusal)
--   {1, queue, committed, token, max, previous_lock_ms, timeout, allowance, charged, rdl}  a
--        queue was locked; allowance is how many records the caller may read (batch caps and the
--        rate limit); charged is 1 when the rate-limit bucket was charged the allowance; a batch
--        starting below rdl may hold records handed out before: it is flagged redelivered
--   {0, next_wake_ms | -1}   nothing to lock now
--   {2}                      paused
--   {3, reason}              refused: unauthorized | unregistered | topic_not_allowed |
--                            client_id_required | client_id_not_allowed
--   {4, retry_after_ms}      over the consumer's rate limit
--   {5, start}               a queue has no committed offset: restore it first ('earliest' or
--                            'latest', the start position of queues the checkpoint lacks)
--   {6}                      a delta request that cannot be served: send every queue ('full')
--   {7, shards}              the consumer has this many shards, not ARGV[21]: route again
--
-- Choosing in constant time (docs/design/constant-time-choose.md): the ready index holds the
-- queues with a backlog and no live lock in choose order, the lock index the locked ones by lock
-- time (prelude ix_keys). A delta request applies the watermark changes the node sends, moves
-- expired locks back to ready, and takes the first ready queue not skipped that the hash confirms
-- (a member the hash contradicts, written before a gateway that did not keep the indexes changed
-- the hash, is fixed and passed). A full request scans every queue, as the design this follows
-- does, and rebuilds the indexes; the node sends one when it has no version the hash absorbed,
-- and the script asks for one ({6}) when the indexes are missing, older than ARGV[20] (so
-- anything a gateway without them wrote heals within it) or from another Redis process.
local key, cfgkey, clients, grants, bucket = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local topic, now, client = ARGV[1], tonumber(ARGV[2]), ARGV[6]

if ARGV[11] == '1' and not granted(grants, ARGV[12], ARGV[13]) then return {3, 'unauthorized'} end

local cfg = redis.call('HMGET', cfgkey, 'consume_timeout_ms', 'start', 'paused', 'registered',
                       'topics', 'mode', 'max_batch', 'rate', 'burst', 'shards')
-- Before anything is written: a caller with a stale shard count would file queues in the wrong
-- shard (every shard holds a copy of the settings, shards included: store/registry.py).
local shards = tonumber(cfg[10]) or 1
if shards ~= tonumber(ARGV[21]) then return {7, shards} end
if cfg[4] == '1' then
  if not string.find(cfg[5] or '', ',' .. ARGV[15] .. ',', 1, true) then return {3, 'topic_not_allowed'} end
  if cfg[6] == 'broadcast' and client == '' then return {3, 'client_id_required'} end
  if cfg[6] == 'cluster' and client ~= '' then return {3, 'client_id_not_allowed'} end
elseif ARGV[10] ~= '1' then
  return {3, 'unregistered'}
end
-- Every accepted poll is stamped, whatever it returns ('poll' has no ':', so it is never taken
-- for a queue's field): reports tell a consumer that stopped polling from one that is caught up
-- on a quiet topic, whose queues see no lock or commit.
redis.call('HSET', key, 'poll', ARGV[2])
-- A polling clientId is alive, also while the consumer is paused or over its rate limit: its
-- offsets must not expire under it (they would restart at `start`, skipping records).
if client ~= '' then
  local idle = tonumber(ARGV[7])
  redis.call('ZADD', clients, now, client)
  redis.call('ZREMRANGEBYSCORE', clients, '-inf', '(' .. (now - idle))
  redis.call('PEXPIRE', clients, idle)
  redis.call('PEXPIRE', key, idle)
end
if cfg[3] == '1' then return {2} end
local timeout = tonumber(cfg[1]) or tonumber(ARGV[3])
local start = cfg[2] or ARGV[4]
-- A retry topic holds only records this consumer failed, written before its first read there:
-- it is read from its beginning whatever the consumer's start is.
if ARGV[15] ~= topic then start = 'earliest' end
local allowance = tonumber(ARGV[9])
if tonumber(cfg[7]) and tonumber(cfg[7]) < allowance then allowance = tonumber(cfg[7]) end

-- The token bucket shared by every node (the prelude's refill, on Redis' clock).
local rate, burst, tokens, bucket_ts = tonumber(cfg[8]), nil, nil, nil
if rate and rate > 0 then
  burst = bucket_burst(rate, cfg[9])
  tokens, bucket_ts = refill(bucket, rate, burst)
  if tokens < 1 then
    store_bucket(bucket, rate, burst, tokens, bucket_ts)
    return {4, math.ceil((1 - tokens) * 1000 / rate)}
  end
  if math.floor(tokens) < allowance then allowance = math.floor(tokens) end
end

local skip = ARGV[8]
local first = 22
local n = (#ARGV - first + 1) / 3
local restore = ARGV[14] == '1' and client == ''
local source, since, version = ARGV[17], tonumber(ARGV[18]), ARGV[19]
local rkey, lkey, xkey = ix_keys(key, topic)
local run = run_id()

-- Lock the chosen queue (both paths).
local function lock_queue(best, best_com, best_max, best_lock, best_backlog)
  local charged = 0
  if tokens then  -- charge what this batch can at most return; a short read is refunded (refund.lua)
    if best_backlog < allowance then allowance = best_backlog end
    store_bucket(bucket, rate, burst, tokens - allowance, bucket_ts)
    charged = 1
  end
  local p = topic .. ':' .. best .. ':'
  seed_token(key, p .. 'tok')  -- the first token of a queue comes from the clock (prelude)
  local tok = redis.call('HINCRBY', key, p .. 'tok', 1)
  -- The handed-out mark (rdl): batches starting below it may hold records handed out before.
  -- An expired lock's batch was handed out, and nobody said how far: up to its bound `out` (the
  -- allowance it was granted; com + 1 for a lock taken by a gateway before `out`), so the mark
  -- rises to it, whatever happens to this lock next (a read that fails and gives it back keeps
  -- the mark). /unlock raises it to the batch's end (unlock.lua), a rewind to the old position
  -- (reset.lua), a restore to the log's end (restore.lua).
  local m = redis.call('HMGET', key, p .. 'rdl', p .. 'out')
  local rdl = tonumber(m[1]) or 0
  local lock_fields = {p .. 'lock', now, p .. 'acc', now, p .. 'addr', ARGV[5], p .. 'out',
                       best_com + allowance}
  if best_lock > 0 then
    local handed = math.max(tonumber(m[2]) or 0, best_com + 1)
    if handed > rdl then  -- written only when it rises: most locks leave it as it is
      rdl = handed
      lock_fields[#lock_fields + 1] = p .. 'rdl'
      lock_fields[#lock_fields + 1] = rdl
    end
  end
  redis.call('HSET', key, unpack(lock_fields))
  redis.call('ZADD', lkey, now, best)
  return {1, best, best_com, tok, best_max, best_lock, timeout, allowance, charged, rdl}
end

local function expire_all()
  if client ~= '' then  -- idle clientIds' offsets (and their indexes) expire
    for _, k in ipairs({key, rkey, lkey, xkey}) do redis.call('PEXPIRE', k, ARGV[7]) end
  end
end

local function skipped(q) return string.find(skip, ',' .. q .. ',', 1, true) end

if ARGV[16] == 'delta' then
  -- (indexes built under another shard count may hold queues of other shards: store/shards.py)
  local x = redis.call('HMGET', xkey, 'built', 'n:' .. source, 'shards')
  if not x[1] or clock_ms() - tonumber(x[1]) >= tonumber(ARGV[20]) or (x[3] or '1') ~= ARGV[21]
      or (tonumber(x[2]) or -1) < since or redis.call('HGET', key, topic .. ':era') ~= run then
    return {6}
  end
  -- The watermarks that changed: raise max, start com, re-score the queue if it is not held.
  for i = 0, n - 1 do
    local q = ARGV[first + 3 * i]
    local lo, hi = tonumber(ARGV[first + 1 + 3 * i]), tonumber(ARGV[first + 2 + 3 * i])
    local p = topic .. ':' .. q .. ':'
    local v = redis.call('HMGET', key, p .. 'max', p .. 'com', p .. 'lock', p .. 'acc')
    local mx, com, lock = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]) or 0
    if mx == nil or hi > mx then
      mx = hi
      redis.call('HSET', key, p .. 'max', mx)
    end
    if com == nil then
      if restore then return {5, start} end
      if start == 'earliest' then com = lo else com = mx end
      redis.call('HSET', key, p .. 'com', com)
    end
    ix_file(key, topic, q, {mx, com, lock, v[4]}, now, timeout)
  end
  if tonumber(version) > tonumber(x[2]) then redis.call('HSET', xkey, 'n:' .. source, version) end
  -- Locks that ran out (with the current timeout: a shortened one applies to held locks) are
  -- ready again; the hash keeps their lock time, which flags the takeover.
  local gone = redis.call('ZRANGEBYSCORE', lkey, '-inf', now - timeout)
  for _, q in ipairs(gone) do  -- (a lock the hash says is live: extended by an older gateway)
    local p = topic .. ':' .. q .. ':'
    ix_file(key, topic, q, redis.call('HMGET', key, p .. 'max', p .. 'com', p .. 'lock', p .. 'acc'),
            now, timeout)
  end
  -- The first ready queue not skipped that the hash confirms.
  -- Pages of 2, then 16: the first member is nearly always the one (a page of 16 cost 12 us
  -- more per call at 16 queues).
  local fixes, offset, size = 0, 0, 2
  while true do
    local page = redis.call('ZRANGE', rkey, offset, offset + size - 1, 'WITHSCORES')
    if #page == 0 then break end
    local again = false
    for j = 1, #page, 2 do
      local member, score = page[j], tonumber(page[j + 1])
      local acc_text, q = string.match(member, '^(%d+):(.+)$')
      if not skipped(q) then
        local p = topic .. ':' .. q .. ':'
        local v = redis.call('HMGET', key, p .. 'max', p .. 'com', p .. 'lock', p .. 'acc')
        local mx, com = tonumber(v[1]) or 0, tonumber(v[2]) or 0
        local lock, acc = tonumber(v[3]) or 0, tonumber(v[4]) or 0
        if v[2] and mx - com > 0 and (lock == 0 or now - lock >= timeout)
            and tonumber(acc_text) == acc and score == com - mx then
          redis.call('ZREM', rkey, member)
          local reply = lock_queue(q, com, mx, lock, mx - com)
          expire_all()
          return reply
        end
        -- The hash disagrees: held (a lock the index missed), no backlog, another backlog or
        -- access time. Fix the entry and look again from the top.
        redis.call('ZREM', rkey, member)
        ix_file(key, topic, q, v, now, timeout)
        fixes = fixes + 1
        if fixes > 64 then return {6} end
        again, offset = true, 0  -- a re-scored entry may now sort before the skipped ones
        break
      end
      offset = offset + 1
    end
    if not again and #page < 2 * size then break end
    size = 16
  end
  expire_all()
  local head = redis.call('ZRANGE', lkey, 0, 0, 'WITHSCORES')
  if #head == 0 then return {0, -1} end
  return {0, tonumber(head[2]) + timeout}
end

if n == 0 then return {0, -1} end
local names = {}
for i = 0, n - 1 do
  local p = topic .. ':' .. ARGV[first + 3 * i] .. ':'
  names[4 * i + 1] = p .. 'max'
  names[4 * i + 2] = p .. 'com'
  names[4 * i + 3] = p .. 'lock'
  names[4 * i + 4] = p .. 'acc'
end
names[4 * n + 1] = topic .. ':era'
local vals = hmget_list(key, names)

-- A hash last written by another Redis process (a replica promoted by a failover, a restart from
-- disk) may have lost its last writes: commits (records acked come again), locks and the
-- handed-out marks that would flag them, tokens (a lost lock's token would be handed out again,
-- and its stale ack taken). So every queue of the topic flags batches below its log end as this
-- node knows it, as a restore after a Redis loss does (restore.lua), and its token jumps to the
-- clock's (never below one handed out before). A hash without the field (new, or from before it)
-- just takes it.
if vals[4 * n + 1] ~= run then
  local era = {topic .. ':era', run}
  if vals[4 * n + 1] then
    local marks = {}
    for i = 0, n - 1 do marks[i + 1] = topic .. ':' .. ARGV[first + 3 * i] .. ':rdl' end
    local old = hmget_list(key, marks)
    for i = 0, n - 1 do
      local p = topic .. ':' .. ARGV[first + 3 * i] .. ':'
      local bound = math.max(tonumber(ARGV[first + 2 + 3 * i]), tonumber(vals[4 * i + 1]) or 0)
      if bound > (tonumber(old[i + 1]) or 0) then
        era[#era + 1] = p .. 'rdl'
        era[#era + 1] = bound
      end
      reseed_token(key, p .. 'tok')
    end
  end
  hset_pairs(key, era)
end

local writes = {}
local best, best_backlog, best_acc, best_com, best_max, best_lock = nil, 0, 0, 0, 0, 0
local wake = -1
local ready, held = {}, {}  -- the indexes, rebuilt from what this scan sees
for i = 0, n - 1 do
  local q = ARGV[first + 3 * i]
  local lo, hi = tonumber(ARGV[first + 1 + 3 * i]), tonumber(ARGV[first + 2 + 3 * i])
  local mx, com = tonumber(vals[4 * i + 1]), tonumber(vals[4 * i + 2])
  local lock, acc = tonumber(vals[4 * i + 3]) or 0, tonumber(vals[4 * i + 4]) or 0
  if mx == nil or hi > mx then
    mx = hi
    writes[#writes + 1] = names[4 * i + 1]
    writes[#writes + 1] = mx
  end
  if com == nil then
    if restore then return {5, start} end  -- nothing written yet but poll
    if start == 'earliest' then com = lo else com = mx end
    writes[#writes + 1] = names[4 * i + 2]
    writes[#writes + 1] = com
  end
  local backlog = mx - com
  local free = lock == 0 or now - lock >= timeout
  if lock ~= 0 and not free then
    held[#held + 1] = lock
    held[#held + 1] = q
  elseif backlog > 0 then
    ready[#ready + 1] = -backlog
    ready[#ready + 1] = ix_member(acc, q)
  end
  if backlog > 0 and not skipped(q) then
    if free then
      if best == nil or backlog > best_backlog or (backlog == best_backlog
          and (acc < best_acc or (acc == best_acc and q < best))) then
        best, best_backlog, best_acc, best_com, best_max, best_lock = q, backlog, acc, com, mx, lock
      end
    elseif wake < 0 or lock + timeout < wake then
      wake = lock + timeout
    end
  end
end
if #writes > 0 then hset_pairs(key, writes) end
redis.call('DEL', rkey, lkey)
for i = 1, #ready, SLICE do
  redis.call('ZADD', rkey, unpack(ready, i, math.min(i + SLICE - 1, #ready)))
end
for i = 1, #held, SLICE do
  redis.call('ZADD', lkey, unpack(held, i, math.min(i + SLICE - 1, #held)))
end
if redis.call('HLEN', xkey) > 64 then redis.call('DEL', xkey) end  -- sources of nodes gone
redis.call('HSET', xkey, 'built', clock_ms(), 'shards', ARGV[21])
if source ~= '' and tonumber(version) > (tonumber(redis.call('HGET', xkey, 'n:' .. source)) or -1) then
  redis.call('HSET', xkey, 'n:' .. source, version)  -- only forward: calls of one node may cross
end
local reply = {0, wake}
if best ~= nil then
  redis.call('ZREM', rkey, ix_member(best_acc, best))
  reply = lock_queue(best, best_com, best_max, best_lock, best_backlog)
end
expire_all()
return reply
