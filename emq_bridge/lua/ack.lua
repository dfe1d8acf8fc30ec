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
-- Two calls, not three: HINCRBY creates a hash that is gone, which then holds that one
-- field, so only a count of 1 (a record's first fire, or a record gone) is checked.
-- `gone`: the records this ack deleted, touched no more (cluster slot migration: below).
local gone = {}
local function count(record, released_ms)
  if gone[record] then return end  -- a second count would make it and delete it again
  local result = redis.pcall('HINCRBY', record, 'fired', 1)
  if type(result) == 'table' and result.err then
    if redis.call('TYPE', record).ok ~= 'hash' then return end  -- gone is 'none': no error
    -- pcall: a write refused here (out of memory: the HINCRBY's error may be that too) must
    -- not fail the ack, whose leases would then be sent again.
    redis.pcall('HSET', record, 'fired', 1, 'last_fired_ms', released_ms)
    return
  end
  if result == 1 and redis.call('HLEN', record) == 1 then
    redis.call('DEL', record)  -- the record was gone: made by the HINCRBY, not kept
    gone[record] = true
    return
  end
  redis.pcall('HSET', record, 'last_fired_ms', released_ms)
end

-- Cluster slot migration: while the queue's slot is MIGRATING, a command on a key this
-- script emptied fails ("non local key": the server takes it for a key moved away) and the
-- writes made before it stay: an ack that dropped the last lease would fail at its next
-- read of the key, applied but reported failed. So the ack counts what the key holds, and
-- once it holds nothing it is touched no more (the hand-backs find nothing, and there is no
-- earliest deadline).

-- ZREM in chunks: Lua's unpack fails past a few thousand values (LUAI_MAXCSTACK), and a
-- failed ack would leave a large batch to be re-dispatched every lease. Returns the number
-- removed and whether the key is empty after (no chunk is sent once it is).
local function zrem_all(key, members, from, to)
  if from > to then return 0, false end
  local removed, left = 0, redis.call('ZCARD', key)
  for i = from, to, 1000 do
    if left == 0 then break end
    local n = redis.call('ZREM', key, unpack(members, i, math.min(i + 999, to)))
    removed, left = removed + n, left - n
  end
  return removed, left == 0
end

local fence, released_ms = ARGV[1], ARGV[2]
local last = 4 + tonumber(ARGV[4])
local dropped, emptied = 0, false
if fence == '' then
  dropped, emptied = zrem_all(KEYS[1], ARGV, 5, last)
else
  -- The fenced leases are read one by one and dropped in one ZREM (a chunk), before any is
  -- handed back; `held` counts a member given twice once.
  local drop, held, records = {}, {}, {}
  local number = tonumber(fence)
  for i = 5, last do
    local member = ARGV[i]
    local deadline = redis.call('ZSCORE', KEYS[1], member)
    if deadline and not held[member] and tonumber(deadline) == number then
      held[member] = true
      drop[#drop + 1] = member
      records[#records + 1] = KEYS[i - 3]
    end
  end
  -- The leases go first, the counts after: a server over its maxmemory refuses a script's
  -- first write that may grow memory (the counts' HINCRBY), not a ZREM, after which the
  -- script may write; counted first, the counts were refused and the leases dropped anyway.
  dropped, emptied = zrem_all(KEYS[1], drop, 1, #drop)
  if released_ms ~= '' then
    for _, record in ipairs(records) do count(record, released_ms) end
  end
  local handed = 0
  local first_back = last + 1
  if emptied then first_back = #ARGV + 1 end  -- nothing left to hand back
  for i = first_back, #ARGV do
    local deadline = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if deadline and tonumber(deadline) == number then
      redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[i])
      handed = handed + 1
    end
  end
  if handed > 0 then redis.pcall('PUBLISH', ARGV[3], 'ack') end
end
local first = {}
if not emptied then first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES') end
return {dropped, first[2] or ''}
