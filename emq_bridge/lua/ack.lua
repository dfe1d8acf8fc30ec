-- ack: drop the leases of occurrences the broker has accepted.
--
-- KEYS[1]  <prefix>:{q}:leases   sorted set: "<name> <due_ms>" -> lease deadline
-- ARGV     lease members to drop (may be empty)
--
-- Returns {number of leases dropped, earliest remaining lease deadline or ''}.
local dropped = 0
if #ARGV > 0 then dropped = redis.call('ZREM', KEYS[1], unpack(ARGV)) end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {dropped, first[2] or ''}
