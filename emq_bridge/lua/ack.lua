-- ack: drop and count the leases of occurrences the broker has accepted, if this pump still
-- holds them, and hand back the leases of those it will not send.
--
-- KEYS[1]  <prefix>:{q}:leases   sorted set: lease member -> lease deadline (keys.py)
-- KEYS[1 + i]  <prefix>:{q}:repeat:<name>  the record of acked member i (ARGV[4 + i]), when
--          ARGV[2] counts them; no record keys otherwise
-- ARGV[1]  the lease deadline the acking pump wrote, epoch ms; '' drops the members whatever
--          their deadline (members edited into garbage, or leases of registrations gone)
-- ARGV[2]  when the acked occurrences were released, epoch ms: each lease dropped adds 1 to
--          its record's `fired` and sets `last_fired_ms`; '' counts nothing
-- ARGV[3]  wake channel, published to once if a lease was handed back
-- ARGV[4]  n, how many members follow to drop
-- ARGV[5 .. 4+n]  lease members to drop (may be none): "<name> <due_ms>" for a scheduled
--          occurrence, "<name> <due_ms> triggered" for a trigger (what claim leased)
-- ARGV[5+n ..]  lease members to hand back (fenced only): a lease still at ARGV[1] moves to
--          deadline 0, expired at once, so the next tick of any pump sends it (same id,
--          marked redelivered: the pump that handed it back may have sent it)
--
-- The fence: a lease whose deadline is not the one given was re-taken by another pump after
-- it expired (or extended by it), so it is that pump's to ack, count or hand back, and stays.
-- `fired` therefore counts each occurrence the broker accepted once, at the ack that dropped
-- its lease (a trigger too).
-- Returns {number of leases dropped, earliest remaining lease deadline or ''}.

-- Add 1 to `fired` and note the release instant. A counter edited by hand into a
-- non-integer restarts at 1; a record gone (or not a hash) is left alone, never created.
local function count(record, released_ms)
  if redis.call('EXISTS', record) == 0 then return end
  local result = redis.pcall('HINCRBY', record, 'fired', 1)
  if type(result) == 'table' and result.err then redis.pcall('HSET', record, 'fired', 1) end
  redis.pcall('HSET', record, 'last_fired_ms', released_ms)
end

local fence, released_ms = ARGV[1], ARGV[2]
local last = 4 + tonumber(ARGV[4])
local dropped = 0
if fence == '' then
  -- In chunks: Lua's unpack fails past a few thousand values (LUAI_MAXCSTACK), and a
  -- failed ack would leave a large batch to be re-dispatched every lease.
  for i = 5, last, 1000 do
    dropped = dropped + redis.call('ZREM', KEYS[1], unpack(ARGV, i, math.min(i + 999, last)))
  end
else
  for i = 5, last do
    local deadline = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if deadline and tonumber(deadline) == tonumber(fence) then
      dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[i])
      if released_ms ~= '' then count(KEYS[i - 3], released_ms) end
    end
  end
  local handed = 0
  for i = last + 1, #ARGV do
    local deadline = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if deadline and tonumber(deadline) == tonumber(fence) then
      redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[i])
      handed = handed + 1
    end
  end
  if handed > 0 then redis.call('PUBLISH', ARGV[3], 'ack') end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {dropped, first[2] or ''}
