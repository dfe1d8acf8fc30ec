-- backfill: queue past slots of a registration for the pumps to send, each at most once.
--
-- KEYS[1]  <prefix>:{q}:repeat             sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>      hash: the registration record
-- KEYS[3]  <prefix>:{q}:leases             sorted set: lease member -> lease deadline
-- KEYS[4]  <prefix>:{q}:backfill:<name>    sorted set: slot -> slot, every slot backfilled
-- ARGV[1]  name
-- ARGV[2]  the registry score as the caller read it ('' when the member was missing)
-- ARGV[3]  the record's `paused_next_ms` as read ('' when none)
-- ARGV[4]  the live frontier: the nominal slot of that score (or of `paused_next_ms`), ''
--          for none; a slot at or after it is the live schedule's to fire, never backfilled
-- ARGV[5]  JSON array of the candidate slots, nominal epoch ms as decimal strings, ascending
-- ARGV[6]  when to send the first slot queued, epoch ms
-- ARGV[7]  ms between two slots queued (the rate limit; 0 for none)
-- ARGV[8]  '1' for a dry run: decide, write nothing
-- ARGV[9]  wake channel
-- ARGV[10] the record's `cadence_digest` as read ('' when none; absent: not compared)
--
-- The frontier and the slots were computed by the caller from ARGV[2..3] and the cadence of
-- ARGV[10] (cron math is Python's): if the score, `paused_next_ms` or `cadence_digest`
-- changed since the read, nothing is written (-2) and the caller reads again. The bounds are read here, from the record as it is now (bounds.py): a
-- registration with a `limit` is never backfilled (-3: its runs are counted, and a backfill
-- would add runs it cannot have); a slot before `start_ms`, after `end_ms` or, for a
-- one-off, not one of its `at` instants is a slot the schedule cannot have (`outside`).
-- Otherwise a slot is skipped when it is at or after the frontier (`ahead`), when a run
-- of slots fired live covers it (claim.lua's `runs`, and the open run from..to of `run`,
-- "<from> <to> <next>"; a record from before runs: created_ms..last_due_ms; one whose `run`
-- or `runs` is garbage: everything up to last_due_ms, else the frontier) (`live`), or when
-- a backfill queued it already (`done`). Every other slot is added to KEYS[4] and queued as the pending member
-- "<name> <slot> backfill" in KEYS[3], scored by its send time, which claim.lua turns into
-- the lease "<name> <slot> backfilled" when it is due: one send, the id of the live slot.
-- The slots queued follow the registration's later changes: claim.lua drops a pending one
-- the schedule can no longer have and holds it while paused. So that it can tell a change
-- of the fields that place the slots, a backfill that queues keeps their signature in the
-- record (`backfill_cadence`, slot_signature: claim.lua's too); one that finds another
-- signature there first drops the slots still pending under it (walking the ledger, once
-- per such change), but those it would queue itself, and counts them in `backfill_dropped`.
-- Returns {1, queued slots (JSON), live, done, ahead, outside}; -1 no such registration;
-- -2 changed; -3 it has a limit.
-- A key of another type (edited by hand) fails the call before anything is written: a slot
-- marked in KEYS[4] whose lease KEYS[3] then refused would count as `done` for good and
-- never be sent.
for i, wanted in ipairs({'zset', 'hash', 'zset', 'zset'}) do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= wanted and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is a ' .. kind .. ', not a ' .. wanted)
  end
end
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local parked = redis.call('HGET', KEYS[2], 'paused_next_ms')
if (score or '') ~= ARGV[2] and tonumber(score) ~= tonumber(ARGV[2]) then return -2 end
if (parked or '') ~= ARGV[3] then return -2 end
if ARGV[10] and (redis.call('HGET', KEYS[2], 'cadence_digest') or '') ~= ARGV[10] then
  return -2
end

-- #include slots
local placed = redis.call('HMGET', KEYS[2], 'backfill_cadence', unpack(SLOT_FIELDS))
local signature = slot_signature(placed, 2)

local f = redis.call('HMGET', KEYS[2], 'runs', 'run', 'last_due_ms', 'created_ms',
  'start_ms', 'end_ms', 'at', 'limit')
if f[8] and f[8] ~= '' then return -3 end
local start_ms, end_ms = tonumber(f[5]), tonumber(f[6])
local instants = nil
if f[7] and f[7] ~= '' then
  instants = {}
  for at in string.gmatch(f[7], '%d+') do instants[tonumber(at)] = true end
end
local function outside_bounds(slot)
  return (start_ms and slot < start_ms) or (end_ms and slot > end_ms)
    or (instants ~= nil and not instants[slot])
end
local runs = {}
for from, to in string.gmatch(f[1] or '', '(%d+)%-(%d+)') do
  runs[#runs + 1] = {tonumber(from), tonumber(to)}
end
local open_from, open_to = string.match(f[2] or '', '^(%d+) (%d+) %S+$')
-- A `runs` or `run` edited into garbage (by hand) says nothing of what fired: every slot up
-- to the last one fired (else the frontier) counts as fired live, as for a record from
-- before runs, so nothing is sent twice.
local damaged = (f[2] and f[2] ~= '' and not open_from)
  or not string.match((string.gsub(f[1] or '', '%d+%-%d+', '')), '^ *$')
if open_from then
  runs[#runs + 1] = {tonumber(open_from), tonumber(open_to)}
end
if (damaged or not f[2]) and (tonumber(f[3]) or (damaged and tonumber(ARGV[4]))) then
  local last = tonumber(f[3]) or (tonumber(ARGV[4]) - 1)
  runs[#runs + 1] = {damaged and 0 or (tonumber(f[4]) or 0), last}
end
local function fired_live(slot)
  for _, run in ipairs(runs) do
    if run[1] <= slot and slot <= run[2] then return true end
  end
  return false
end

local frontier = tonumber(ARGV[4])
local at, spacing, dry = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
local queued, live, done, ahead, outside = {}, 0, 0, 0, 0
local kept = {}  -- the slots of this call the schedule has: pending ones of them stay
for _, text in ipairs(cjson.decode(ARGV[5])) do
  local slot = tonumber(text)
  if outside_bounds(slot) then
    outside = outside + 1
  elseif frontier and slot >= frontier then
    ahead = ahead + 1
  elseif fired_live(slot) then
    live = live + 1
  elseif redis.call('ZSCORE', KEYS[4], text) then
    done = done + 1
    kept[text] = true
  else
    if not dry then
      redis.call('ZADD', KEYS[4], slot, text)
      redis.call('ZADD', KEYS[3], string.format('%d', at + #queued * spacing),
        ARGV[1] .. ' ' .. text .. ' backfill')
    end
    queued[#queued + 1] = text
    kept[text] = true
  end
end

-- The slots still pending under another signature (see above), but `kept`. After the writes
-- above, and no command on a key once it is empty (cluster slot migration, claim.lua).
local function drop_former_slots()
  local dropped, left = 0, redis.call('ZCARD', KEYS[3])
  for _, text in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    if left == 0 then break end
    local member = ARGV[1] .. ' ' .. text .. ' backfill'
    if not kept[text] and redis.call('ZREM', KEYS[3], member) == 1 then
      left = left - 1
      redis.call('ZREM', KEYS[4], text)
      dropped = dropped + 1
    end
  end
  if dropped == 0 then return end
  -- A counter edited by hand into a non-integer restarts (claim.lua's `count`).
  local counted = redis.pcall('HINCRBY', KEYS[2], 'backfill_dropped', dropped)
  if type(counted) == 'table' and counted.err then
    redis.call('HSET', KEYS[2], 'backfill_dropped', dropped)
  end
end
if not dry and placed[1] ~= signature and (placed[1] or #queued > 0) then
  if placed[1] then drop_former_slots() end
  redis.call('HSET', KEYS[2], 'backfill_cadence', signature)
end
if #queued > 0 and not dry then redis.pcall('PUBLISH', ARGV[9], 'backfill') end
local reply = '[]'
if #queued > 0 then reply = cjson.encode(queued) end
return {1, reply, live, done, ahead, outside}
