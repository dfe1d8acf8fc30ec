-- ack: drop the leases of occurrences the broker has accepted, if this pump still holds them.
--
-- KEYS[1]  <prefix>:{q}:leases   sorted set: lease member -> lease deadline (keys.py)
-- ARGV[1]  the lease deadline the acking pump wrote, epoch ms; '' drops the members whatever
--          their deadline (members edited into garbage, or leases of registrations gone)
-- ARGV[2..] lease members to drop (may be none): "<name> <due_ms>" for a scheduled
--          occurrence, "<name> <due_ms> triggered" for a trigger (what claim leased)
--
-- The fence: a lease whose deadline is not the one given was re-taken by another pump after
-- it expired (or extended by it), so it is that pump's to ack, and stays.
-- Returns {number of leases dropped, earliest remaining lease deadline or ''}.
local fence = ARGV[1]
local dropped = 0
if fence == '' then
  -- In chunks: Lua's unpack fails past a few thousand values (LUAI_MAXCSTACK), and a
  -- failed ack would leave a large batch to be re-dispatched every lease.
  for i = 2, #ARGV, 1000 do
    dropped = dropped + redis.call('ZREM', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
else
  for i = 2, #ARGV do
    local deadline = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if deadline and tonumber(deadline) == tonumber(fence) then
      dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[i])
    end
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {dropped, first[2] or ''}
