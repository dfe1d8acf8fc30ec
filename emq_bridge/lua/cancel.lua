-- cancel: remove a registration, its registry member and its leases.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[3]  <prefix>:{q}:leases          sorted set: "<name> <due_ms>" -> lease deadline
-- KEYS[4]  <prefix>:{q}:generations     hash: source -> highest generation synced
-- KEYS[5]  <prefix>:{q}:running         sorted set: occurrence in flight -> lost deadline
-- KEYS[6]  <prefix>:{q}:history:<name>  list: the registration's last occurrences
-- KEYS[7]  <prefix>:{q}:backfill:<name> sorted set: the slots backfills queued
-- KEYS[8]  <prefix>:{q}:synced          hash: the sync stamps (stamp.lua)
-- ARGV[1]  name
-- ARGV[2]  owner guard: when not empty, cancel only if the record's `source` equals it
-- ARGV[3]  generation of that owner's declarations ('' for none: no check)
--
-- Removing a record with an owner counts one write of it in KEYS[8], when that source keeps
-- a counter there (upsert.lua). Removing the registry member of a record that is gone (deleted
-- by hand with DEL) or not a hash, whose owner cannot be read, counts one write of every
-- source that keeps one: a stamp vouched for it, and the next sync of its source, whichever
-- it is, reads in full (and creates it again, if declared).
-- Returns 1 when something was removed, 0 when nothing existed (or the guard refused), and
-- '!' followed by the stored generation when the queue holds a higher generation of the
-- owner than ARGV[3] (nothing removed: a sync of older declarations must not prune what a
-- newer one keeps). Otherwise the stored generation is raised to ARGV[3], in this script.
-- A key this script reads or edits, of another type (edited by hand), fails the call before
-- anything is removed (KEYS[4] only when it is read: a generation is given); the record may
-- be of any type (a record that is not a hash is removed, with no owner), and so may the
-- history and backfill keys (deleted whole).
local checks = {{1, 'zset'}, {3, 'zset'}, {5, 'zset'}, {8, 'hash'}}
if ARGV[3] ~= '' then checks[#checks + 1] = {4, 'hash'} end
for _, check in ipairs(checks) do
  local key, wanted = KEYS[check[1]], check[2]
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= wanted and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. wanted)
  end
end
if ARGV[3] ~= '' then
  local live = redis.call('HGET', KEYS[4], ARGV[2])
  if live and tonumber(live) > tonumber(ARGV[3]) then return '!' .. live end
  if not live or tonumber(live) < tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
  end
end
local owner = redis.pcall('HGET', KEYS[2], 'source')
local not_hash = type(owner) == 'table'
if not_hash then owner = false end  -- not a hash (edited by hand): no owner
if ARGV[2] ~= '' and owner ~= ARGV[2] then return 0 end
local had_record = redis.call('DEL', KEYS[2])
local had_member = redis.call('ZREM', KEYS[1], ARGV[1])
local removed = had_record + had_member

-- One more write in KEYS[8]'s counter `counter` (`{w}<source>`).
local function count_write(counter)
  local result = redis.pcall('HINCRBY', KEYS[8], counter, 1)  -- edited by hand: restart
  if type(result) == 'table' and result.err then redis.call('HSET', KEYS[8], counter, 1) end
end
if owner and removed > 0 and redis.call('HEXISTS', KEYS[8], '{w}' .. owner) == 1 then
  count_write('{w}' .. owner)
elseif had_member == 1 and (had_record == 0 or not_hash) then
  for _, field in ipairs(redis.call('HKEYS', KEYS[8])) do
    if string.sub(field, 1, 3) == '{w}' then count_write(field) end
  end
end
redis.call('DEL', KEYS[6], KEYS[7])
local prefix = ARGV[1] .. ' '
for _, key in ipairs({KEYS[3], KEYS[5]}) do
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix then
      removed = removed + redis.call('ZREM', key, member)
    end
  end
end
if removed > 0 then return 1 end
return 0
