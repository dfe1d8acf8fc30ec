-- trigger: fire a registration once now, as a fresh occurrence, leaving its cadence alone.
--
-- KEYS[1]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[2]  <prefix>:{q}:leases          sorted set: "<name> <due_ms>" -> lease deadline
-- ARGV[1]  name
-- ARGV[2]  now, epoch ms (the occurrence's nominal time)
-- ARGV[3]  wake channel
--
-- The occurrence is written as an already expired lease "<name> <now_ms> manual", so the
-- next pump tick dispatches it through the re-dispatch path, marked as triggered.
-- Returns 1, or 0 if there is no such registration.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], 0, ARGV[1] .. ' ' .. ARGV[2] .. ' manual')
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
