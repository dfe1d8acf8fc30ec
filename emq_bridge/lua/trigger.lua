-- trigger: fire a registration once now, as a fresh occurrence, leaving its cadence alone.
--
-- KEYS[1]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[2]  <prefix>:{q}:leases          sorted set: lease member -> lease deadline (keys.py)
-- ARGV[1]  name
-- ARGV[2]  now, epoch ms (the occurrence's nominal time)
-- ARGV[3]  wake channel
--
-- The occurrence is written as a pending trigger "<name> <now_ms> manual" with score 0, so
-- the next pump tick finds it among the expired leases. Claim turns it into the lease
-- "<name> <now_ms> triggered": the first send is not a redelivery, a send after that lease
-- expired is. (Pumps of an older version read the pending member as they always did.)
-- A trigger's instant is its occurrence's nominal time, so its id: a second trigger in the
-- same millisecond as the registration's last one (a double click, a loop) takes the next
-- millisecond instead, so it is a run of its own with an id of its own, not the earlier
-- trigger's id sent again (whose reports would then be taken as already made). The record's
-- `trigger_ms` keeps the last instant taken.
-- Returns the instant taken (epoch ms, the occurrence's nominal time), or -1 if there is no
-- such registration.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local at = tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[1], 'trigger_ms'))
if last and last >= at then at = last + 1 end
local shown = string.format('%d', at)
redis.call('HSET', KEYS[1], 'trigger_ms', shown)
redis.call('ZADD', KEYS[2], 0, ARGV[1] .. ' ' .. shown .. ' manual')
redis.call('PUBLISH', ARGV[3], ARGV[1])
return at
