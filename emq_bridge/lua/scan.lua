-- scan: read what is due, without writing. The pump's first round trip of a tick.
--
-- KEYS[1]  <prefix>:{q}:repeat   sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:leases   sorted set: lease member -> lease deadline (keys.py)
-- KEYS[3]  <prefix>:{q}:running  sorted set: occurrence in flight -> lost deadline
-- ARGV[1]  now, epoch ms; empty to use the server clock (TIME)
-- ARGV[2]  batch size
--
-- Returns the JSON text of [now_ms, due, expired, earliest registry score or '', earliest
-- lease deadline or '', lost, earliest `running` deadline or ''], where due is
-- [name, score, ...], expired [member, ...] and lost the `running` members whose deadline
-- passed; now and the scores are strings. One bulk reply, which a client parses in one call:
-- a pump scans every queue it serves each tick, most of them idle.
-- Expired members include the pending triggers "<name> <due_ms> manual", scored 0
-- (trigger.lua).
local t = redis.call('TIME')
-- In flight until a deadline on this server's clock, whatever clock the pump runs on.
local server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = ARGV[1]
if now == '' then
  now = string.format('%d', server_now)  -- tostring writes 1e+14 and on in exponent form
end
local batch = tonumber(ARGV[2])

-- Whether a set whose lowest score is `score` (nil: empty) holds nothing at or before
-- `limit`: then its range is not read, the idle case costing one ZRANGE a set.
local function none_by(score, limit)
  if score == nil or score == 'inf' then return true end
  local number = tonumber(score)  -- nil for '-inf' on some Lua versions: read the range
  return number ~= nil and number > tonumber(limit)
end

local function first_score(key)
  return redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
end

local first = first_score(KEYS[1])
local first_lease = first_score(KEYS[2])
local first_running = first_score(KEYS[3])
local due, expired, lost = {}, {}, {}
if not none_by(first, now) then
  due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, batch)
end
if not none_by(first_lease, now) then
  expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
end
if not none_by(first_running, server_now) then
  lost = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', server_now, 'LIMIT', 0, batch)
end

local function json(list)
  if #list == 0 then return '[]' end  -- cjson would write an empty table as {}
  return cjson.encode(list)
end
local function quoted(value)  -- a number's text, or '' for none
  return '"' .. (value or '') .. '"'
end
return '[' .. quoted(now) .. ',' .. json(due) .. ',' .. json(expired) .. ','
  .. quoted(first) .. ',' .. quoted(first_lease) .. ',' .. json(lost) .. ','
  .. quoted(first_running) .. ']'
