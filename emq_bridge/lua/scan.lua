-- scan: read what is due, without writing. The pump's first round trip of a tick.
--
-- KEYS[1]  <prefix>:{q}:repeat   sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:leases   sorted set: lease member -> lease deadline (keys.py)
-- KEYS[3]  <prefix>:{q}:running  sorted set: occurrence in flight -> lost deadline
-- ARGV[1]  now, epoch ms; empty to use the server clock (TIME)
-- ARGV[2]  batch size
--
-- Returns {now_ms, due, expired, earliest registry score or '', earliest lease deadline or '',
--          lost, earliest `running` deadline or ''} where due is the JSON text of [name, score, ...], expired that of
-- [member, ...] and lost that of the `running` members whose deadline passed: one
-- value each, which a client parses in one call instead of one per element. Expired members
-- include the pending triggers "<name> <due_ms> manual", scored 0 (trigger.lua).
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local batch = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, batch)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
-- In flight until a deadline on this server's clock, whatever clock the pump runs on.
local t = redis.call('TIME')
local server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', server_now, 'LIMIT', 0, batch)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local first_lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local function json(list)
  if #list == 0 then return '[]' end  -- cjson would write an empty table as {}
  return cjson.encode(list)
end
local first_running = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {now, json(due), json(expired), first[2] or '', first_lease[2] or '', json(lost),
        first_running[2] or ''}
