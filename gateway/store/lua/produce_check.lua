-- May this caller produce to this topic? One round trip for the API key and the producer registry.
--
-- KEYS[1] API keys (hash key id -> JSON record)  KEYS[2] producers (hash name -> JSON record)
-- ARGV[1] auth '1'|'0'  ARGV[2] key id  ARGV[3] key sha256 (hex)  ARGV[4] open mode '1'|'0'
-- ARGV[5] producer name from the request ('' if none)  ARGV[6] topic
-- Returns {'ok', producer} or {reason, producer} (store/offsets.py: ProduceVerdict) with reason one of
--   unauthenticated | forbidden | producer_required | unregistered_producer | topic_not_allowed
local producer, topic = ARGV[5], ARGV[6]
local function member(list, v)
  for _, x in ipairs(list or {}) do if x == v then return true end end
  return false
end

if ARGV[1] == '1' then
  local raw = redis.call('HGET', KEYS[1], ARGV[2])
  if not raw then return {'unauthenticated', producer} end
  local rec = cjson.decode(raw)
  if not same_digest(rec.sha256, ARGV[3]) then return {'unauthenticated', producer} end
  local mine = rec.producers or {}
  if producer == '' then
    if #mine ~= 1 then return {#mine == 0 and 'forbidden' or 'producer_required', producer} end
    producer = mine[1]
  elseif not member(mine, producer) then
    return {'forbidden', producer}
  end
end

if producer == '' then
  if ARGV[4] == '1' then return {'ok', ''} end
  return {'producer_required', ''}
end
local reg = redis.call('HGET', KEYS[2], producer)
if not reg then
  if ARGV[4] == '1' then return {'ok', producer} end
  return {'unregistered_producer', producer}
end
if not member(cjson.decode(reg).topics, topic) then return {'topic_not_allowed', producer} end
return {'ok', producer}
