-- upsert: register each item, or rewrite its record when its definition digest differs.
--
-- KEYS[1]      <prefix>:{q}:repeat          sorted set: name -> next run (epoch ms)
-- KEYS[2]      <prefix>:{q}:generations     hash: source -> highest generation synced
-- KEYS[2 + i]  <prefix>:{q}:repeat:<name>   hash: the record of item i
-- ARGV[1]  wake channel (published to once if anything was written)
-- ARGV[2]  now, epoch ms (created_ms of a new record)
-- ARGV[3]  JSON array of items, one per record key (may be empty), each
--          [name, digest (covers the owner too), cadence digest, first run ms (a string),
--           [record field, value, ...], [definition fields to delete, ...]]
-- ARGV[4]  the source the items belong to ('' for none)
-- ARGV[5]  the generation of that source's declarations ('' for none: no check)
--
-- The items travel as one JSON argument: a boot sync of many schedules would otherwise
-- spend most of its client time encoding arguments.
-- Generation guard: when ARGV[5] is given and the queue holds a higher generation of the
-- source, nothing is written and the reply is '!' followed by that generation. Otherwise
-- the stored generation is raised to ARGV[5] (never lowered) in the same script as the
-- writes, so two syncs of different generations cannot interleave into a revert.
-- Returns one digit per item, as one string: 0 unchanged (nothing written), 1 created,
-- 2 updated (a client parses one string faster than an array of integers).
-- An update keeps the score unless the cadence changed; a paused record stays paused
-- (score +inf). A record whose registry member went missing gets it back (repair).
-- A score never moves to a slot at or before the last fired one (`after_fired`).
local registry = KEYS[1]

if ARGV[5] ~= '' then
  local live = redis.call('HGET', KEYS[2], ARGV[4])
  if live and tonumber(live) > tonumber(ARGV[5]) then return '!' .. live end
  if not live or tonumber(live) < tonumber(ARGV[5]) then
    redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
  end
end

-- The first run to write, or one after the record's last fired slot (claim.lua's
-- last_due_ms) if it is not: a first run derived from a `now` a pump has passed since (a sync
-- that stalled after reading the clock) may be at or before that slot, and a slot at it
-- would fire again. An interval steps on by whole intervals; a cron, which Lua cannot
-- compute, keeps `live`, its current next run (the claim of that slot put it after it), or,
-- with none (a member removed by hand), goes just after the last fired slot.
local function after_fired(record, first_run, live, last)
  last = tonumber(last)
  if not last or tonumber(first_run) > last then return first_run end
  local fields = redis.call('HMGET', record, 'every_ms', 'cron')
  local every = tonumber(fields[1])
  if every and every > 0 and (not fields[2] or fields[2] == '') then
    local steps = math.floor((last - tonumber(first_run)) / every) + 1
    return string.format('%d', tonumber(first_run) + steps * every)
  end
  if tonumber(live) and tonumber(live) > last then return live end
  return string.format('%d', last + 1)
end

local function upsert(record, item)
  local name, digest, cadence_digest, first_run, fields, stale =
    item[1], item[2], item[3], item[4], item[5], item[6]
  if redis.call('EXISTS', record) == 0 then
    redis.call('HSET', record, 'created_ms', ARGV[2], unpack(fields))
    redis.call('ZADD', registry, first_run, name)
    return 1
  end
  local cur = redis.call(
    'HMGET', record, 'digest', 'cadence_digest', 'paused', 'paused_next_ms', 'last_due_ms'
  )
  local paused, last = cur[3] == '1', cur[5]
  local live = redis.call('ZSCORE', registry, name)
  if cur[1] == digest then
    -- Unchanged. Only repair a record whose registry member went missing.
    if live then return 0 end
    redis.call('ZADD', registry, paused and '+inf' or after_fired(record, first_run, nil, last), name)
    return 2
  end
  if #stale > 0 then redis.call('HDEL', record, unpack(stale)) end
  redis.call('HSET', record, unpack(fields))
  if cur[2] ~= cadence_digest then
    if paused then
      redis.call('HSET', record, 'paused_next_ms', after_fired(record, first_run, cur[4], last))
      redis.call('ZADD', registry, '+inf', name)
    else
      redis.call('ZADD', registry, after_fired(record, first_run, live, last), name)
    end
  elseif not live then
    redis.call('ZADD', registry, paused and '+inf' or after_fired(record, first_run, nil, last), name)
  end
  return 2
end

local results, written = {}, false
for i, item in ipairs(cjson.decode(ARGV[3])) do
  results[i] = upsert(KEYS[2 + i], item)
  written = written or results[i] ~= 0
end
if written then redis.call('PUBLISH', ARGV[1], 'upsert') end
return table.concat(results)
