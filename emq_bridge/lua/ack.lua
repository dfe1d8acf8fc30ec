-- ack: drop the leases of occurrences the broker has accepted.
--
-- KEYS[1]  <prefix>:{q}:leases   sorted set: "<name> <due_ms>" -> lease deadline
-- ARGV     lease members to drop
--
-- Returns the number of leases dropped.
return redis.call('ZREM', KEYS[1], unpack(ARGV))
