-- upsert: register each item, or rewrite its record when its definition digest differs.
--
-- KEYS[1]      <prefix>:{q}:repeat          sorted set: name -> next run (epoch ms)
-- KEYS[1 + i]  <prefix>:{q}:repeat:<name>   hash: the record of item i
-- ARGV[1]  wake channel (published to once if anything was written)
-- ARGV[2]  now, epoch ms (created_ms of a new record)
-- ARGV[3]  JSON array of items, one per record key, each
--          [name, digest (covers the owner too), cadence digest, first run ms (a string),
--           [record field, value, ...], [definition fields to delete, ...]]
--
-- The items travel as one JSON argument: a boot sync of many schedules would otherwise
-- spend most of its client time encoding arguments.
-- Returns one digit per item, as one string: 0 unchanged (nothing written), 1 created,
-- 2 updated (a client parses one string faster than an array of integers).
-- An update keeps the score unless the cadence changed; a paused record stays paused
-- (score +inf). A record whose registry member went missing gets it back (repair).
local registry = KEYS[1]

local function upsert(record, item)
  local name, digest, cadence_digest, first_run, fields, stale =
    item[1], item[2], item[3], item[4], item[5], item[6]
  if redis.call('EXISTS', record) == 0 then
    redis.call('HSET', record, 'created_ms', ARGV[2], unpack(fields))
    redis.call('ZADD', registry, first_run, name)
    return 1
  end
  local cur = redis.call('HMGET', record, 'digest', 'cadence_digest', 'paused')
  local paused = cur[3] == '1'
  local parked = paused and '+inf' or first_run
  if cur[1] == digest then
    -- Unchanged. Only repair a record whose registry member went missing.
    if redis.call('ZSCORE', registry, name) then return 0 end
    redis.call('ZADD', registry, parked, name)
    return 2
  end
  if #stale > 0 then redis.call('HDEL', record, unpack(stale)) end
  redis.call('HSET', record, unpack(fields))
  if cur[2] ~= cadence_digest then
    if paused then redis.call('HSET', record, 'paused_next_ms', first_run) end
    redis.call('ZADD', registry, parked, name)
  elseif not redis.call('ZSCORE', registry, name) then
    redis.call('ZADD', registry, parked, name)
  end
  return 2
end

local results, written = {}, false
for i, item in ipairs(cjson.decode(ARGV[3])) do
  results[i] = upsert(KEYS[1 + i], item)
  written = written or results[i] ~= 0
end
if written then redis.call('PUBLISH', ARGV[1], 'upsert') end
return table.concat(results)
