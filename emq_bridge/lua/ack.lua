-- ack: drop the leases of occurrences the broker has accepted.
--
-- KEYS[1]  <prefix>:{q}:leases   sorted set: lease member -> lease deadline (keys.py)
-- ARGV     lease members to drop (may be empty): "<name> <due_ms>" for a scheduled
--          occurrence, "<name> <due_ms> triggered" for a trigger (what claim leased)
--
-- Returns {number of leases dropped, earliest remaining lease deadline or ''}.
local dropped = 0
-- In chunks: Lua's unpack fails past a few thousand values (LUAI_MAXCSTACK), and a
-- failed ack would leave a large batch to be re-dispatched every lease.
for i = 1, #ARGV, 1000 do
  dropped = dropped + redis.call('ZREM', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {dropped, first[2] or ''}
