-- register: EchoMQ's idempotent register, guarded by EXISTS.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run (epoch ms)
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[3]  <prefix>:{q}:synced          hash: the sync stamps (stamp.lua)
-- ARGV[1]  name
-- ARGV[2]  first run, epoch ms
-- ARGV[3]  wake channel (published to when a record is written)
-- ARGV[4..] record field, value pairs (every_ms, template, ...)
--
-- Bounds (bounds.py): a `limit` field gets its `remaining` counter; a first run past the
-- record's last instant (`end_ms`, the last of `at`) registers it completed: score +inf,
-- `completed` and `completed_ms` (its `created_ms`), as claim.lua and upsert.lua do.
-- A record with an owner (`source`) counts one write of it in KEYS[3], when that source
-- keeps a counter there (upsert.lua).
-- Returns 1 when registered, 0 when the record exists (nothing written).
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
-- A registry key of another type (edited by hand), or a stamps key of another type for a
-- record with an owner, fails the call before the record is written: a record without its
-- registry member would block the name ("exists") and never fire.
local checks = {{1, 'zset'}}
for i = 4, #ARGV - 1, 2 do
  if ARGV[i] == 'source' then checks[2] = {3, 'hash'} end
end
for _, check in ipairs(checks) do
  local key, wanted = KEYS[check[1]], check[2]
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= wanted and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. wanted)
  end
end
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
local f = redis.call('HMGET', KEYS[2], 'end_ms', 'at', 'limit', 'created_ms')
if f[3] then redis.call('HSET', KEYS[2], 'remaining', f[3]) end
local first, reason = tonumber(ARGV[2]), nil
local last_at = f[2] and tonumber(string.match(f[2], '(%d+)$'))
if last_at and first > last_at then
  reason = 'at'
elseif tonumber(f[1]) and first > tonumber(f[1]) then
  reason = 'end_at'
end
if reason then redis.call('HSET', KEYS[2], 'completed', reason, 'completed_ms', f[4] or '') end
redis.call('ZADD', KEYS[1], reason and '+inf' or ARGV[2], ARGV[1])
local owner = redis.call('HGET', KEYS[2], 'source')
if owner and redis.call('HEXISTS', KEYS[3], '{w}' .. owner) == 1 then
  local result = redis.pcall('HINCRBY', KEYS[3], '{w}' .. owner, 1)  -- edited by hand: restart
  if type(result) == 'table' and result.err then redis.call('HSET', KEYS[3], '{w}' .. owner, 1) end
end
redis.pcall('PUBLISH', ARGV[3], ARGV[1])
return 1
