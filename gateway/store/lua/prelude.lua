-- Prelude: code shared by the gateway's scripts, written once. gateway/store/scripts.py prepends
-- it to every script in this directory when registering it (redis-py register_script, so each
-- call is one EVALSHA of prelude + script).
--
-- Why a prelude and not a Redis 7 Function library (FUNCTION LOAD): plain scripts work on Redis 6
-- as well, and on Redis Cluster without a FUNCTION LOAD on every shard (a library lives per node,
-- so a node added or promoted would have none until someone loaded it there). A script needs no
-- such step: redis-py answers a NOSCRIPT (an empty script cache after a failover or restart) by
-- loading the script and calling it again.
--
-- Only `local function`s below: nothing runs, and no globals (Redis refuses them). Line numbers in
-- a script's error messages count these lines too.

-- Lua's unpack stops at LUAI_MAXCSTACK (8,000 values), so commands over more fields go in
-- slices: choose.lua reads 4 fields a queue, and a topic of 2,000 partitions broke /message
-- ("too many results to unpack", found by bench/choose_cost.py at 4,096), as it broke the
-- watermark refresh (4 values a queue). Even: a slice never splits a field from its value.
local SLICE = 4000

-- HSET of the field/value pairs list[from..to] (the whole list by default), in slices.
local function hset_pairs(key, list, from, to)
  from, to = from or 1, to or #list
  for i = from, to, SLICE do
    redis.call('HSET', key, unpack(list, i, math.min(i + SLICE - 1, to)))
  end
end

-- HMGET of any number of fields, as one reply list.
local function hmget_list(key, names)
  if #names <= SLICE then return redis.call('HMGET', key, unpack(names)) end
  local out = {}
  for i = 1, #names, SLICE do
    local part = redis.call('HMGET', key, unpack(names, i, math.min(i + SLICE - 1, #names)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

-- Constant-time comparison of two digests (hex strings), so that the time taken does not tell how
-- many leading characters of a guess were right. `want` may be false/nil (nothing stored).
local function same_digest(want, got)
  if not want or #want ~= #got then return false end
  local diff = 0
  for i = 1, #want do diff = bit.bor(diff, bit.bxor(string.byte(want, i), string.byte(got, i))) end
  return diff == 0
end

-- The API key (id, sha256 of the whole key) may consume as the consumer whose grants hash this is.
local function granted(grants, key_id, sha)
  return same_digest(redis.call('HGET', grants, key_id), sha)
end

-- Redis' clock in ms. Node clocks differ, and a call that waited in a queue carries an old `now`:
-- whatever must agree across nodes (rate-limit buckets, token seeds) runs on this one clock.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The clock (ms) x 1000, as a token (a string: a Lua number this large would be formatted as
-- 1.79e+15).
local function clock_token()
  local t = redis.call('TIME')
  return t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)) .. '000'
end

-- A queue's first lock token is the clock (ms) x 1000, not 1: when a hash is deleted (unregister
-- with deleteOffsets, an expired clientId) and made again, its tokens never repeat earlier ones,
-- so a requestId from before can never pass for the new holder's.
local function seed_token(key, field)
  if redis.call('HEXISTS', key, field) == 0 then redis.call('HSET', key, field, clock_token()) end
end

-- A token that may be lower than one handed out before (its hash regressed: choose.lua's era)
-- jumps to the clock's; one already past it stays.
local function reseed_token(key, field)
  local seed = clock_token()
  if (tonumber(redis.call('HGET', key, field)) or 0) < tonumber(seed) then
    redis.call('HSET', key, field, seed)
  end
end

-- The Redis process this script runs in: INFO server's run_id, new at every start of a process.
-- A consumer hash remembers the process that last wrote it (`<topic>:era`, choose.lua); another
-- one means a failover to a replica or a restart from disk, after which the hash may hold less
-- than was written (replication and fsync are asynchronous). ~5 us per call (100,000 in a script:
-- 0.5 s); INFO replication's replid costs 2 us, but only run_id is sure to change at each start.
-- (fakeredis, the unit tests' Redis, has no INFO: '' there, one era for ever.)
local function run_id()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return '' end
  return string.match(info, 'run_id:(%w+)') or ''
end

-- A rate-limit bucket's size: the consumer's `burst`, else its rate (at least 1).
local function bucket_burst(rate, burst)
  return tonumber(burst) or math.max(math.floor(rate), 1)
end

-- Token bucket shared by every node: refilled at `rate` messages/s up to `burst`, on Redis' clock
-- (see clock_ms; either skew would refill the same interval twice). A bucket never written is
-- full, and its time never goes backwards. Reads only: returns (tokens, ts) for the caller to
-- write back if it spends any.
local function refill(bucket, rate, burst)
  local now = clock_ms()
  local b = redis.call('HMGET', bucket, 'tokens', 'ts')
  local tokens = tonumber(b[1]) or burst
  local last = tonumber(b[2]) or now
  if now > last then return math.min(burst, tokens + (now - last) * rate / 1000), now end
  return tokens, last
end

-- Write a bucket back after `refill` (its tokens, minus what was spent, and ts). It expires once it
-- would be full again, plus a second: a bucket never written is full, so expiring loses nothing.
local function store_bucket(bucket, rate, burst, tokens, ts)
  redis.call('HSET', bucket, 'tokens', tokens, 'ts', ts)
  redis.call('PEXPIRE', bucket, math.ceil(burst * 1000 / rate) + 1000)
end


-- The indexes over one topic's queues in a consumer hash (choose.lua; docs/design/
-- constant-time-choose.md), named from the hash's key, so in its slot:
--   <key>:ir:<topic>  zset  queues with a backlog and no live lock: score -(max - com), member
--                           '<acc, 13 digits>:<queue>' (equal scores sort by member: the least
--                           recently accessed first, then the queue id: choose.lua's order)
--   <key>:il:<topic>  zset  locked queues, scored by lock time (ms)
--   <key>:ix:<topic>  hash  `built` (Redis' clock when the indexes were last rebuilt from the
--                           hash) and `n:<source>` (the version of a node's watermark copy the
--                           hash has absorbed: that node sends only what changed after it)
-- The hash stays the truth: the indexes are hints that choose.lua checks against it, and
-- rebuilds (its full path) when they are missing, old or the hash changed process (era).
local function ix_keys(key, topic)
  return key .. ':ir:' .. topic, key .. ':il:' .. topic, key .. ':ix:' .. topic
end

-- A queue's member in the ready index.
local function ix_member(acc, q)
  return string.format('%013d', acc) .. ':' .. q
end

-- Index keys written outside choose.lua live as long as the hash (a broadcast clientId's expires
-- when idle).
local function ix_expire_like(key, names)
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then
    for _, k in ipairs(names) do redis.call('PEXPIRE', k, ttl) end
  end
end

-- File queue q of `topic` in the indexes by its hash fields v = {max, com, lock, acc}: a live
-- lock -> the lock index (live: younger than `timeout`; nil: any lock is); else out of the lock
-- index and, with a committed offset and a backlog, into the ready index. The one rule for
-- ack.lua, unlock.lua and extend.lua (ix_place) and for choose.lua's delta path (the watermarks
-- applied, expired locks swept, a contradicted entry fixed). A ready member of an older `acc` may
-- remain: choose.lua drops it when it meets it (the hash disagrees).
local function ix_file(key, topic, q, v, now, timeout)
  local r, l = ix_keys(key, topic)
  local lock = tonumber(v[3]) or 0
  if lock ~= 0 and (timeout == nil or now - lock < timeout) then
    redis.call('ZADD', l, lock, q)
    return
  end
  redis.call('ZREM', l, q)
  local com = tonumber(v[2])
  local backlog = com and (tonumber(v[1]) or 0) - com or 0
  if backlog > 0 then redis.call('ZADD', r, -backlog, ix_member(tonumber(v[4]) or 0, q)) end
end

-- Put the queue whose fields start with `p` ('topic:queue:') where its hash fields say, after
-- ack.lua, unlock.lua or extend.lua changed them. Only while the topic's indexes are kept.
local function ix_place(key, p)
  local topic, q = string.match(p, '^(.*):([^:]+):$')
  local r, l, x = ix_keys(key, topic)
  if redis.call('EXISTS', x) == 0 then return end
  ix_file(key, topic, q, redis.call('HMGET', key, p .. 'max', p .. 'com', p .. 'lock', p .. 'acc'))
  ix_expire_like(key, {r, l})
end

-- Forget a topic's indexes (a reset or a restore moved offsets of many queues): the next choose
-- rebuilds them from the hash.
local function ix_drop(key, topic)
  local r, l, x = ix_keys(key, topic)
  redis.call('DEL', r, l, x)
end

-- Whether the batch [off, nxt) fetched under lock token `token` may still be acted on (ack.lua
-- commits it, extend.lua extends its lock): nil if so, else why not; then the queue's committed
-- offset, lock time and max offset. The order of the checks is the one ack.lua's header (and the
-- README) gives: a reset since the fetch, already committed, another fetch's lock, moved offset.
local function batch_refusal(key, p, off, nxt, token)
  local v = redis.call('HMGET', key, p .. 'com', p .. 'tok', p .. 'lock', p .. 'max', p .. 'rtok')
  local com = tonumber(v[1])
  if com == nil then return 'unknown', -1, 0, 0 end
  local tok, lock, mx = tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0
  if token <= (tonumber(v[5]) or 0) then return 'offset_reset', com, lock, mx end
  if com >= nxt then return 'already_committed', com, lock, mx end
  if tok ~= token then return 'lock_lost', com, lock, mx end
  if com ~= off then return 'offset_mismatch', com, lock, mx end
  return nil, com, lock, mx
end

-- A consumer's lock timeout (ms): its own `consume_timeout_ms`, else the gateway's default.
local function lock_timeout(config_key, default_ms)
  return tonumber(redis.call('HGET', config_key, 'consume_timeout_ms')) or tonumber(default_ms)
end

-- Commit the batch [off, nxt) fetched under lock token `token` from the queue whose fields start
-- with `p` in the consumer hash `key` (config hash `config_key`), if the token and offsets still
-- hold: ack.lua's rule, also run for each pending batch of a REST v2 instance
-- (instance_commit.lua). `hw`: the high watermark the fetch saw (-1: none); `check_only`: decide,
-- commit nothing. Returns {result, committed offset, lock state} as ack.lua's header says.
local function ack_batch(key, config_key, p, off, nxt, token, now, default_ms, hw, check_only)
  local refusal, com, lock, mx = batch_refusal(key, p, off, nxt, token)
  if refusal == 'unknown' then return {'unknown', -1, ''} end
  if hw > mx then redis.call('HSET', key, p .. 'max', hw) end
  if refusal then return {refusal, com, ''} end
  local state = 'held'
  if lock == 0 then
    state = 'released'
  elseif now - lock >= lock_timeout(config_key, default_ms) then
    state = 'expired'
  end
  if check_only then return {'committed', com, state} end
  redis.call('HSET', key, p .. 'com', nxt, p .. 'lock', 0, p .. 'acc', now)
  ix_place(key, p)
  return {'committed', nxt, state}
end
