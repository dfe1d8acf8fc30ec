-- trigger: fire a registration once now, as a fresh occurrence, leaving its cadence alone.
--
-- KEYS[1]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[2]  <prefix>:{q}:leases          sorted set: lease member -> lease deadline (keys.py)
-- ARGV[1]  name
-- ARGV[2]  now, epoch ms (the occurrence's nominal time, unless taken: below)
-- ARGV[3]  wake channel
-- ARGV[4]  this call's nonce (Repeat.trigger makes one per call)
--
-- Each trigger is an occurrence of its own: its instant is `now`, or one ms after the
-- registration's last trigger (`last_trigger_ms`) when that is not earlier, so two triggers
-- in one ms are two occurrences with two ids, and a trigger never takes the id of one sent
-- before it (which would go out again as a first send).
-- The occurrence is written as a pending trigger "<name> <now_ms> manual" with score 0, so
-- the next pump tick finds it among the expired leases. Claim turns it into the lease
-- "<name> <now_ms> triggered": the first send is not a redelivery, a send after that lease
-- expired is. (Pumps of an older version read the pending member as they always did.)
-- The same call sent again (redis-py resends a command whose reply timed out, though the
-- server ran it) writes nothing and answers the first one's instant, so the caller gets that
-- trigger's id: the record keeps the recent calls' nonces and instants (`trigger_call`, a
-- line each: those of the last `KEPT_MS`, at most `KEPT`), since another caller's trigger
-- may land between a call and its resend.
-- Returns {1, the trigger's instant}, or {0} if there is no such registration. A key of another type (edited by hand)
-- fails the call and writes nothing: a pending member for a record that is not a hash
-- would only be dropped by the pump. (The caller refuses a hash that is not a valid
-- record before calling: Lua cannot decode a definition.)
for i, wanted in ipairs({'hash', 'zset'}) do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= wanted and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is a ' .. kind .. ', not a ' .. wanted)
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
-- A resend comes within the client's retries of timed-out replies: seconds, not a minute.
local KEPT_MS, KEPT = 60000, 64
local at = tonumber(ARGV[2])
local kept = {}
for nonce, made in string.gmatch(redis.call('HGET', KEYS[1], 'trigger_call') or '', '(%S+) (%d+)') do
  if nonce == ARGV[4] then return {1, made} end
  if tonumber(made) > at - KEPT_MS then kept[#kept + 1] = nonce .. ' ' .. made end
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_trigger_ms'))
if last and at <= last then at = last + 1 end
local instant = string.format('%d', at)
if #kept >= KEPT then table.remove(kept, 1) end
kept[#kept + 1] = ARGV[4] .. ' ' .. instant
redis.call('HSET', KEYS[1], 'last_trigger_ms', instant, 'trigger_call', table.concat(kept, '\n'))
redis.call('ZADD', KEYS[2], 0, ARGV[1] .. ' ' .. instant .. ' manual')
redis.pcall('PUBLISH', ARGV[3], ARGV[1])
return {1, instant}
