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
-- ARGV[16..] triples: queue id, low watermark, high watermark
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
local key, cfgkey, clients, grants, bucket = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local topic, now, client = ARGV[1], tonumber(ARGV[2]), ARGV[6]

if ARGV[11] == '1' and not granted(grants, ARGV[12], ARGV[13]) then return {3, 'unauthorized'} end

local cfg = redis.call('HMGET', cfgkey, 'consume_timeout_ms', 'start', 'paused', 'registered',
                       'topics', 'mode', 'max_batch', 'rate', 'burst')
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
local n = (#ARGV - 15) / 3
local restore = ARGV[14] == '1' and client == ''
if n == 0 then return {0, -1} end
local names = {}
for i = 0, n - 1 do
  local p = topic .. ':' .. ARGV[16 + 3 * i] .. ':'
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
local run = run_id()
if vals[4 * n + 1] ~= run then
  local era = {topic .. ':era', run}
  if vals[4 * n + 1] then
    local marks = {}
    for i = 0, n - 1 do marks[i + 1] = topic .. ':' .. ARGV[16 + 3 * i] .. ':rdl' end
    local old = hmget_list(key, marks)
    for i = 0, n - 1 do
      local p = topic .. ':' .. ARGV[16 + 3 * i] .. ':'
      local bound = math.max(tonumber(ARGV[18 + 3 * i]), tonumber(vals[4 * i + 1]) or 0)
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
for i = 0, n - 1 do
  local q = ARGV[16 + 3 * i]
  local lo, hi = tonumber(ARGV[17 + 3 * i]), tonumber(ARGV[18 + 3 * i])
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
  if backlog > 0 and not string.find(skip, ',' .. q .. ',', 1, true) then
    if lock == 0 or now - lock >= timeout then
      if best == nil or backlog > best_backlog or (backlog == best_backlog and acc < best_acc) then
        best, best_backlog, best_acc, best_com, best_max, best_lock = q, backlog, acc, com, mx, lock
      end
    elseif wake < 0 or lock + timeout < wake then
      wake = lock + timeout
    end
  end
end
if #writes > 0 then hset_pairs(key, writes) end
if client ~= '' then redis.call('PEXPIRE', key, ARGV[7]) end  -- idle clientIds' offsets expire
if best == nil then return {0, wake} end

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
-- rises to it, whatever happens to this lock next (a read that fails and gives it back keeps the
-- mark). /unlock raises it to the batch's end (unlock.lua), a rewind to the old position
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
return {1, best, best_com, tok, best_max, best_lock, timeout, allowance, charged, rdl}
