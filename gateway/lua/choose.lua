-- Choose and lock one queue for a consumer, in one round trip.
--
-- KEYS[1] consumer hash   KEYS[2] consumer config hash   KEYS[3] broadcast client registry (zset)
-- ARGV[1] topic  ARGV[2] now (ms)  ARGV[3] default consume timeout (ms)  ARGV[4] default start
-- ARGV[5] client address  ARGV[6] clientId ('' in cluster mode)  ARGV[7] client idle ttl (ms)
-- ARGV[8] queues to skip, as ',q1,q2,' ('' for none)  ARGV[9..] triples: queue id, low watermark, high watermark
--
-- Per queue q of topic t the hash holds  t:q:max  t:q:com  t:q:lock  t:q:tok  t:q:acc  t:q:addr.
-- max never goes down; com starts at the latest (or earliest) offset; a lock is free when 0 or older
-- than the consume timeout; every lock increments tok so stale acks can be told apart.
-- Returns {1, queue, committed, token, max, previous_lock_ms, timeout}, {0, next_wake_ms | -1},
-- or {2} when the consumer is paused (nothing is locked or registered).
local key, cfgkey, clients = KEYS[1], KEYS[2], KEYS[3]
local topic, now = ARGV[1], tonumber(ARGV[2])
local cfg = redis.call('HMGET', cfgkey, 'consume_timeout_ms', 'start', 'paused')
if cfg[3] == '1' then return {2} end
local timeout = tonumber(cfg[1]) or tonumber(ARGV[3])
local start = cfg[2] or ARGV[4]
local skip = ARGV[8]

if ARGV[6] ~= '' then
  local idle = tonumber(ARGV[7])
  redis.call('ZADD', clients, now, ARGV[6])
  redis.call('ZREMRANGEBYSCORE', clients, '-inf', '(' .. (now - idle))
  redis.call('PEXPIRE', clients, idle)
end

local n = (#ARGV - 8) / 3
local names = {}
for i = 0, n - 1 do
  local p = topic .. ':' .. ARGV[9 + 3 * i] .. ':'
  names[4 * i + 1] = p .. 'max'
  names[4 * i + 2] = p .. 'com'
  names[4 * i + 3] = p .. 'lock'
  names[4 * i + 4] = p .. 'acc'
end
if n == 0 then return {0, -1} end
local vals = redis.call('HMGET', key, unpack(names))

local writes = {}
local best, best_backlog, best_acc, best_com, best_max, best_lock = nil, 0, 0, 0, 0, 0
local wake = -1
for i = 0, n - 1 do
  local q = ARGV[9 + 3 * i]
  local lo, hi = tonumber(ARGV[10 + 3 * i]), tonumber(ARGV[11 + 3 * i])
  local mx, com = tonumber(vals[4 * i + 1]), tonumber(vals[4 * i + 2])
  local lock, acc = tonumber(vals[4 * i + 3]) or 0, tonumber(vals[4 * i + 4]) or 0
  if mx == nil or hi > mx then
    mx = hi
    writes[#writes + 1] = names[4 * i + 1]
    writes[#writes + 1] = mx
  end
  if com == nil then
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
if #writes > 0 then redis.call('HSET', key, unpack(writes)) end
if ARGV[6] ~= '' then redis.call('PEXPIRE', key, ARGV[7]) end  -- idle clientIds' offsets expire
if best == nil then return {0, wake} end

local p = topic .. ':' .. best .. ':'
local tok = redis.call('HINCRBY', key, p .. 'tok', 1)
redis.call('HSET', key, p .. 'lock', now, p .. 'acc', now, p .. 'addr', ARGV[5])
return {1, best, best_com, tok, best_max, best_lock, timeout}
