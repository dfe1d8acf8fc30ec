-- extend: move the deadline of leases a pump still holds, while it is still sending them.
--
-- KEYS[1]  <prefix>:{q}:leases   sorted set: lease member -> lease deadline (keys.py)
-- ARGV[1]  the deadline the pump wrote (claim or an earlier extend), epoch ms
-- ARGV[2]  the new deadline, epoch ms
-- ARGV[3..] lease members
--
-- A lease whose deadline is no longer ARGV[1] expired and was re-taken by another pump: it
-- is left alone, and the caller must not send that occurrence (the other pump does).
-- Returns the members extended.
local held = {}
for i = 3, #ARGV do
  local deadline = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if deadline and tonumber(deadline) == tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[i])
    held[#held + 1] = ARGV[i]
  end
end
return held
