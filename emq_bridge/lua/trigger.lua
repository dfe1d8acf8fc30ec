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
-- Returns 1, or 0 if there is no such registration.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], 0, ARGV[1] .. ' ' .. ARGV[2] .. ' manual')
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
