-- claim: compare-and-set claim of due registrations, and re-lease of expired leases.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:leases          sorted set: lease member -> lease deadline (keys.py)
-- KEYS[3 .. 2+n]  <prefix>:{q}:repeat:<name> records, one per candidate
-- KEYS[3+n]  <prefix>:{q}:running      sorted set: occurrence in flight -> lost deadline
-- KEYS[4+n ..]  <prefix>:{q}:history:<name> lists of the guarded candidates (see below)
-- KEYS[...]  then, for each registration with a pending backfill among ARGV[4]'s members, its
--            record <prefix>:{q}:repeat:<name> and its ledger <prefix>:{q}:backfill:<name>
--            (ARGV[8] says where)
-- ARGV[1]  now, epoch ms
-- ARGV[2]  lease deadline, epoch ms
-- ARGV[3]  JSON array of the n candidates, each [name, score read by scan, next score,
--          missed, mode, slot to fire (, history key index, occurrence id (, start
--          timeout ms: ARGV[5] for this one, when its message expires sooner))], numbers as
--          decimal strings. The slot to fire is the nominal time of the occurrence leased
--          (the lease member's, `last_due_ms`): the score read, or the slot the misfire
--          policy chose (cadence.catch_up, pure math of the score read and ARGV[1]).
--          `missed` (slots the policy dropped) is counted whatever the mode but 'defer'.
--          mode 'drop': the policy fires nothing (every passed slot dropped): only move the
--          score and count `missed`
--          mode 'fire': move the score, lease the occurrence, note its slot (`last_due_ms`)
--          and count its missed slots; `fired` is counted when it is acked (ack.lua)
--          mode 'defer': only move the score (a corrupt record is parked)
--          mode 'unread': the pump read no record (none, not a hash, or one with none of the
--          fields it asked for): 'defer', but only while the record still has no `template`
--          (which every record written has). Gone since (a cancel) or registered again since
--          (a cancel and re-add, as an app editing a schedule does), nothing is written: a
--          fresh registration is never parked for the pump's read of the one it replaced
--          mode 'skip' | 'buffer_one' | 'replace': the overlap policy of a guarded
--          registration (definition.py): fire as 'fire' unless an occurrence of it is in
--          flight, i.e. its record's `inflight` member holds a live deadline in `running`.
--          Then 'skip' only moves the score, counts `skipped` and notes the slot in the
--          history (KEYS[history key index]) under the occurrence id given; 'buffer_one'
--          keeps the slot in the record's `buffered` field (report.lua and lost.lua release
--          it when the running one ends), or skips it if one is kept already; 'replace'
--          fires and returns every member in flight it did not replace before (kept in
--          the record's `replaced_runs`), for the pump to revoke. A guarded
--          occurrence fired is in flight at once: `inflight`, and `running` for ARGV[5] ms.
--          Deadlines in `running` are on this server's clock (TIME), whatever the pump's.
-- ARGV[4]  JSON array of expired lease members to re-lease, as scan read them
-- ARGV[5]  how long a guarded occurrence fired stays in flight until a worker reports its
--          start, ms
-- ARGV[6]  the history's length cap
-- ARGV[7]  JSON array, one per candidate: the record's `cadence_digest` as the pump read it
--          with the definition it computed the next score from, or '' (no check; may be
--          absent). A candidate whose record holds another one now is not claimed: its
--          cadence was edited after the pump read it and the upsert kept the score (the new
--          cadence's first run was that slot), so the next score the pump computed is the
--          old cadence's (off the new grid, or past a slot of it). Its next scan reads it
--          again.
-- ARGV[8]  JSON object: name -> [KEYS index of its record, KEYS index of its ledger], for
--          each name with a pending backfill member in ARGV[4] (may be absent: such members
--          are then sent as they are, unjudged)
-- (Two JSON arguments rather than thousands of plain ones: the client packs them cheaply.)
--
-- A candidate is claimed only if its score is still the one scan read, so two pumps never
-- claim the same occurrence; its score moves to the next run in the same step.
-- Bounds (bounds.py), from the record as it is now: a slot past its last instant (`end_ms`,
-- or the last of `at`) or with no run of its `limit` left is not fired; a fired (or
-- buffered) slot takes one from `remaining` in the step that moves the score; a next score
-- past the last instant, or no run left, completes the registration: score +inf, and
-- `completed` (the reason: end_at, limit, at) and `completed_ms` in its record.
-- An expired member is re-leased only if it is still there and expired, so two pumps never
-- re-lease the same one. A pending trigger "<name> <due_ms> manual" (trigger.lua, or any
-- trigger of an older version) is replaced by the lease "<name> <due_ms> triggered": its first
-- send. If that lease already exists, the occurrence is in flight and its lease carries it:
-- the pending member is dropped and not re-leased.
-- A pending buffered slot "<name> <due_ms> buffered" (report.lua) becomes the plain lease
-- "<name> <due_ms>", its first send. A pending backfill "<name> <due_ms> backfill"
-- (backfill.lua, scored by when to send it) becomes the lease "<name> <due_ms> backfilled",
-- unless its record now says otherwise (backfill_verdict, below): dropped when the schedule
-- can no longer have that slot, held (scored ARGV[2]) while it is paused. Its record and
-- ledger keys are given (ARGV[8]); read only for such a member.
-- A fired, buffered or skipped candidate extends the record's runs of slots the live schedule
-- decided (`track`), which a backfill never sends.
-- Returns {{claimed candidate index (1-based), ...}, {re-leased member as given, ...},
--          earliest registry score or '', earliest lease deadline or '',
--          {candidate index, member in flight it replaces, ...} (one pair per member),
--          {skipped index, ...},
--          {buffered index, ...}, {index whose dropped slots were counted, ...}} after the
--          writes: a re-leased "... manual", "... buffered" or "... backfill" member is a
--          first send, any other a redelivery.
-- Add `by` to a counter. A counter edited by hand into a non-integer restarts at `by`
-- instead of failing the script halfway (a script error keeps the writes made before it).
-- Returns the counter's new value.
local function count(record, field, by)
  local result = redis.pcall('HINCRBY', record, field, by)
  if type(result) == 'table' and result.err then
    redis.call('HSET', record, field, by)
    return tonumber(by)
  end
  return result
end

-- The integer ms that scan reported for a score (registry.py `_due_ms`): a score edited by
-- hand to a fraction is floored and -inf is 0, so that member is claimed, not stuck due.
local function due_ms(score)
  local value = tonumber(score)
  if value == -math.huge then return 0 end
  return math.floor(value)
end

-- The reason a registration is complete when its next score is `score`, or nil; `f` is its
-- record's {end_ms, at, remaining, limit} (the same rule in upsert, register and resume).
local function completion(f, score)
  if f[4] and tonumber(f[3]) and tonumber(f[3]) <= 0 then return 'limit' end
  local n = tonumber(score)
  local last_at = f[2] and tonumber(string.match(f[2], '(%d+)$'))
  if last_at and n > last_at then return 'at' end
  if tonumber(f[1]) and n > tonumber(f[1]) then return 'end_at' end
  return nil
end

-- The runs of slots fired live (or skipped by the overlap policy: the live schedule decided
-- them), for backfill.lua (which never sends a slot a run covers):
-- `run` ("<from> <to> <next>") is the open run from..to, extended while each claim fires the
-- slot its previous claim scored (next) with nothing dropped; any other fire closes it into
-- `runs` ("from-to from-to ...", oldest first, at most MAX_RUNS: the two oldest merge, so
-- what lay between them counts as fired, never the other way). A record from before runs
-- existed (no `run`) closes [created_ms, last_due_ms]. `run` '' is no open run (its slots
-- were dropped). One field, not three: a record's fields cost memory each.
local MAX_RUNS = 200
local function close_run(runs, from, to)
  if runs ~= '' then runs = runs .. ' ' end
  runs = runs .. from .. '-' .. to
  local _, spaces = string.gsub(runs, ' ', '')
  if spaces >= MAX_RUNS then
    local a, b, rest = string.match(runs, '^(%d+)%-%d+ %d+%-(%d+)(.*)$')
    if a then runs = a .. '-' .. b .. rest end
  end
  return runs
end

-- The record fields a fired (buffered, skipped) slot writes to its runs, appended to `writes`
-- (field, value, ...) for the caller's one HSET. `f` is the candidate's record read
-- (`run` at 5, `last_due_ms` at 6).
local function track(record, f, expected, next_score, fire, missed, writes)
  local run = f[5]
  local from, to, run_next
  if run then from, to, run_next = string.match(run, '^(%d+) (%d+) (%S+)$') end
  if from and run_next == expected and tonumber(missed) == 0 then
    writes[#writes + 1] = 'run'
    writes[#writes + 1] = from .. ' ' .. fire .. ' ' .. next_score
    return
  end
  local runs
  if from then
    runs = close_run(redis.call('HGET', record, 'runs') or '', from, to)
  elseif (not run or run ~= '') and f[6] then
    -- No open run (a record from before runs), or one edited into garbage: what it covered
    -- is closed as created_ms..last_due_ms (from 0 for garbage), so a backfill never
    -- sends one of its slots again.
    local created = run and '0' or (redis.call('HGET', record, 'created_ms') or '0')
    if not string.match(created, '^%d+$') then created = '0' end
    runs = close_run(redis.call('HGET', record, 'runs') or '', created, f[6])
  end
  writes[#writes + 1] = 'run'
  if tonumber(missed) > 0 then  -- slots were dropped next to this one: a run of its own
    runs = close_run(runs or redis.call('HGET', record, 'runs') or '', fire, fire)
    writes[#writes + 1] = ''
  else
    writes[#writes + 1] = fire .. ' ' .. fire .. ' ' .. next_score
  end
  if runs then
    writes[#writes + 1] = 'runs'
    writes[#writes + 1] = runs
  end
end

-- ZADD many score/member pairs at once, in chunks (Lua's unpack has a stack limit): one
-- call per chunk instead of one per member is most of what a claim costs the server.
local function zadd_all(key, pairs)
  for i = 1, #pairs, 1000 do
    redis.call('ZADD', key, unpack(pairs, i, math.min(i + 999, #pairs)))
  end
end

-- ZREM the served pending members from `key` in chunks, but those in `leased`: a member
-- edited by hand can be both served and the lease of another one, and it stays leased, as
-- when the removal came before the leases. Stops once the key is empty, so that no command
-- touches it after (cluster slot migration, below). Returns true when the key was emptied.
local function remove_served(key, served, leased)
  local gone = {}
  for _, member in ipairs(served) do
    if not leased[member] then gone[#gone + 1] = member end
  end
  if #gone == 0 then return false end
  local left = redis.call('ZCARD', key)
  for i = 1, #gone, 1000 do
    left = left - redis.call('ZREM', key, unpack(gone, i, math.min(i + 999, #gone)))
    if left == 0 then return true end
  end
  return false
end

local now = ARGV[1]
local deadline = ARGV[2]
local candidates = cjson.decode(ARGV[3])
local expired = cjson.decode(ARGV[4])
local running = KEYS[3 + #candidates]
local cap = tonumber(ARGV[6])
local t = redis.call('TIME')
local server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start_deadline = server_now + tonumber(ARGV[5])
local claimed, replaced, skipped, buffered, dropped = {}, {}, {}, {}, {}
local moves, leases, moved = {}, {}, {}
local read_digests = ARGV[7] and cjson.decode(ARGV[7]) or {}

-- True when candidate `i`'s record, whose `cadence_digest` is `now_digest` (nil: none or
-- unreadable), still has the cadence its next score was computed from.
local function same_cadence(i, now_digest)
  local read = read_digests[i]
  if not read or read == '' or not now_digest then return true end
  return now_digest == read
end

-- What the claim of a candidate reads of its record, in one HMGET (`remaining` only with a
-- `limit`): {end_ms, at, remaining, limit, run, last_due_ms, cadence_digest, buffered}.
-- pcall: a record that is not a hash (edited by hand) is deferred and parked by the pump
-- like any corrupt record; it must not fail the claim of the whole batch.
local function read_record(record)
  local f = redis.pcall('HMGET', record, 'end_ms', 'at', 'limit', 'run', 'last_due_ms',
                        'cadence_digest', 'buffered')
  if type(f) ~= 'table' or f.err then return {} end
  local remaining = f[3] and redis.call('HGET', record, 'remaining')
  return {f[1], f[2], remaining or nil, f[3], f[4], f[5], f[6] or nil, f[7] or nil}
end

-- The runs a `replace` took over that a record keeps (`replaced_runs`), newest last.
local REPLACED_MAX = 32

-- True when `record` is a hash with a `template`, as every record written is (pcall: a key
-- of another type, edited by hand, is not).
local function has_template(record)
  return redis.pcall('HEXISTS', record, 'template') == 1
end

-- The member of an occurrence of `record` in flight whose lost deadline has not passed: its
-- `inflight` one, else one in flight beside it (`inflight_also`, report.lua), or nil. With
-- `every`, the list of all of them.
local function in_flight(record, every)
  local f = redis.call('HMGET', record, 'inflight', 'inflight_also')
  local members, live_ones = {f[1] or nil}, {}  -- (a missing field reads as false)
  for member in string.gmatch(f[2] or '', '[^\n]+') do members[#members + 1] = member end
  for _, member in ipairs(members) do
    local live = redis.call('ZSCORE', running, member)
    if live and tonumber(live) > server_now then
      if not every then return member end
      live_ones[#live_ones + 1] = member
    end
  end
  if every then return live_ones end
  return nil
end

for i, candidate in ipairs(candidates) do
  local name, expected, next_score, missed, mode, fire, history, id, start_ms = unpack(candidate)
  local score = redis.call('ZSCORE', KEYS[1], name)
  -- `moved`: the score moves only at the end, so a name given twice is claimed once.
  local record = KEYS[2 + i]
  local bounds = score and due_ms(score) == tonumber(expected) and not moved[name]
    and read_record(record)
  if bounds and mode == 'unread' then
    if has_template(record) then bounds = nil else mode = 'defer' end
  end
  if bounds and same_cadence(i, bounds[7]) then
    moved[name] = true
    local slot = #moves + 1
    moves[slot] = next_score
    moves[slot + 1] = name
    local member = name .. ' ' .. fire
    if mode ~= 'defer' and tonumber(missed) > 0 then
      count(record, 'missed', missed)
      dropped[#dropped + 1] = i
    end
    if mode == 'drop' then mode, fire = 'defer', expected end
    local writes = {}  -- field, value, ...: one HSET for the candidate's record
    -- Without end_ms, at and limit nothing completes: no rule to apply.
    local bounded = bounds[1] or bounds[2] or bounds[4]
    local outside = bounded and completion(bounds, fire)
    if outside then
      mode = 'defer'  -- never fired: the registration completes below
      next_score = expected
    end
    if mode ~= 'defer' and fire ~= expected then
      -- A slot other than the score (a jittered score's nominal slot, jitter.py; a slot the
      -- misfire policy chose) fires only after the last fired one: an upsert that derived a
      -- jittered score again for a slot that fired meanwhile never fires it twice.
      local last = tonumber(bounds[6])
      if last and tonumber(fire) <= last then mode = 'defer' end
    end
    if bounds[8] and (mode == 'fire' or mode == 'replace') then
      -- A slot `buffer_one` held, left there by an edit of the policy: nothing waits under
      -- this one (`allow` sends every slot, `replace` the newest), so it is dropped and
      -- counted, as a pause drops it. Else it waited for an end that `allow`'s overlapping
      -- runs may never leave, and made `replace` skip its slots.
      redis.call('HDEL', record, 'buffered')
      count(record, 'missed', 1)
      if bounds[4] then bounds[3] = count(record, 'remaining', 1) end  -- held, it took one
    end
    if mode ~= 'fire' and mode ~= 'defer' then  -- a guarded registration
      local busy = in_flight(record)
      if busy and (mode == 'skip' or redis.call('HEXISTS', record, 'buffered') == 1) then
        mode = 'skipped'
        count(record, 'skipped', 1)
        local entry = {id, fire, now, '', '', 'skipped', 1, 0, 0, ''}
        redis.call('LPUSH', KEYS[tonumber(history)], cjson.encode(entry))
        redis.call('LTRIM', KEYS[tonumber(history)], 0, cap - 1)
        local newest = tonumber(redis.call('HGET', record, 'history_due'))
        if not newest or tonumber(fire) > newest then  -- report.lua's search bound
          redis.call('HSET', record, 'history_due', fire)
        end
        skipped[#skipped + 1] = i
      elseif busy and mode == 'buffer_one' then
        mode = 'buffered'
        writes[1], writes[2] = 'buffered', fire
        buffered[#buffered + 1] = i
      else
        if busy then  -- 'replace': every occurrence in flight, not replaced before
          -- (a trigger's, a run beside the `inflight` one: the newest slot runs alone; one a
          -- framework could not revoke, Dramatiq's, is replaced once). Kept in the record
          -- (the newest REPLACED_MAX): a heartbeat of one tells its worker to stop it, should
          -- the revoke the pump sends miss it (report.lua); begin.lua lets the slot run.
          local kept, before = {}, {}
          for other in string.gmatch(redis.call('HGET', record, 'replaced_runs') or '',
                                     '[^\n]+') do
            kept[#kept + 1] = other
            before[other] = true
          end
          for _, other in ipairs(in_flight(record, true)) do
            if not before[other] then
              replaced[#replaced + 1] = i
              replaced[#replaced + 1] = other
              kept[#kept + 1] = other
            end
          end
          while #kept > REPLACED_MAX do table.remove(kept, 1) end
          redis.call('HSET', record, 'replaced_runs', table.concat(kept, '\n'))
        end
        writes[1], writes[2] = 'inflight', member
        local start_at = start_deadline
        if start_ms and start_ms ~= '' then start_at = server_now + tonumber(start_ms) end
        redis.call('ZADD', running, start_at, member)
        mode = 'fire'
      end
    end
    -- A slot the overlap policy skipped was the live schedule's too: backfill.lua leaves it.
    if mode == 'fire' or mode == 'buffered' or mode == 'skipped' then
      track(record, bounds, expected, next_score, fire, missed, writes)
    end
    if mode == 'fire' then
      leases[#leases + 1] = deadline
      leases[#leases + 1] = member
      writes[#writes + 1] = 'last_due_ms'
      writes[#writes + 1] = fire
      claimed[#claimed + 1] = i
    end
    if bounds[4] and (mode == 'fire' or mode == 'buffered') then
      bounds[3] = count(record, 'remaining', -1)
    end
    local reason = outside or (bounded and completion(bounds, next_score))
    if reason then
      moves[slot] = '+inf'
      writes[#writes + 1] = 'completed'
      writes[#writes + 1] = reason
      writes[#writes + 1] = 'completed_ms'
      writes[#writes + 1] = now
    end
    if #writes > 0 then redis.call('HSET', record, unpack(writes)) end
  end
end
-- Pending backfills ("<name> <slot> backfill") follow the changes their registration had
-- since the backfill queued them: backfill_verdict reads its record (one HMGET a name, only
-- when such a member is due) and says 'drop' for a slot the schedule cannot have now (before
-- `start_ms`, after `end_ms`, not one of a one-off's `at`; any slot once it has a `limit`,
-- whose runs are counted; any slot once the fields that place its slots differ from those
-- backfill.lua queued it under, `backfill_cadence`), 'hold' while it is paused (a resume
-- sends it), else nil: sent. A record that cannot be read (gone, not a hash, no cadence) is
-- left to the pump, which drops the lease and reports it, as for any lease of such a record.
-- SLOT_FIELDS and slot_signature (slots.lib.lua) are backfill.lua's too: one signature.
-- #include slots
local BACKFILL_READ = {'paused', 'start_ms', 'end_ms', 'at', 'limit', 'backfill_cadence',
                       unpack(SLOT_FIELDS)}
local backfill_rules = {}  -- name -> what backfill_verdict applies, or false: unreadable
local backfill_keys = ARGV[8] and cjson.decode(ARGV[8]) or {}  -- name -> {record, ledger}
local function read_backfill_rules(name)
  local at = backfill_keys[name]
  if type(at) ~= 'table' then return false end  -- not given: sent unjudged, as before
  local f = redis.pcall('HMGET', KEYS[at[1]], unpack(BACKFILL_READ))
  if type(f) ~= 'table' or f.err or not (f[7] or f[11] or f[4]) then return false end
  local rules = {paused = f[1] == '1', limit = f[5] and f[5] ~= '',
                 start_ms = tonumber(f[2]), end_ms = tonumber(f[3])}
  if f[4] and f[4] ~= '' then
    rules.instants = {}
    for at in string.gmatch(f[4], '%d+') do rules.instants[at] = true end
  end
  -- Members queued before backfills kept a signature (no `backfill_cadence`) are not judged.
  rules.moved = f[6] and f[6] ~= slot_signature(f, 7)
  return rules
end
local function backfill_verdict(name, slot)
  if backfill_rules[name] == nil then backfill_rules[name] = read_backfill_rules(name) end
  local rules = backfill_rules[name]
  if not rules then return nil end
  local at = tonumber(slot)
  if rules.limit or rules.moved or (rules.start_ms and at < rules.start_ms)
    or (rules.end_ms and at > rules.end_ms) or (rules.instants and not rules.instants[slot]) then
    return 'drop'
  end
  if rules.paused then return 'hold' end
  return nil
end

-- Take the dropped backfilled slots off their ledgers (`<prefix>:{q}:backfill:<name>`, next
-- to the registry key), so a later backfill may queue them again if the schedule has them
-- again, and count them in the record's `backfill_dropped`. One ZREM a thousand
-- slots, none once the ledger is empty: a key emptied is touched no more (cluster slot
-- migration, below).
local function forget_backfilled(unqueued)
  for name, slots in pairs(unqueued) do
    local at = backfill_keys[name]  -- judged, so given
    local ledger = KEYS[at[2]]
    -- pcall: a ledger gone (by hand) reads as a key moved away while the slot is MIGRATING;
    -- it must not fail the claim after its leases were written.
    local left = redis.pcall('ZCARD', ledger)
    if type(left) ~= 'number' then left = 0 end
    for i = 1, #slots, 1000 do
      if left == 0 then break end
      left = left - redis.call('ZREM', ledger, unpack(slots, i, math.min(i + 999, #slots)))
    end
    count(KEYS[at[1]], 'backfill_dropped', #slots)
  end
end

local PENDING, TRIGGERED, BUFFERED = ' manual', ' triggered', ' buffered'
local BACKFILL, BACKFILLED = ' backfill', ' backfilled'
local released, held, served = {}, {}, {}
local unqueued = {}  -- name -> {slot, ...}: backfilled slots dropped, off its ledger at the end
for _, member in ipairs(expired) do
  local lease = redis.call('ZSCORE', KEYS[2], member)
  if lease and tonumber(lease) <= tonumber(now) then
    local target = member
    if string.sub(member, -#PENDING) == PENDING then
      target = string.sub(member, 1, -#PENDING - 1) .. TRIGGERED
    elseif string.sub(member, -#BUFFERED) == BUFFERED then
      target = string.sub(member, 1, -#BUFFERED - 1)
    elseif string.sub(member, -#BACKFILL) == BACKFILL then  -- backfill.lua's, due to send
      target = string.sub(member, 1, -#BACKFILL - 1) .. BACKFILLED
      local name, slot = string.match(member, '^(.*) (%d+) backfill$')
      local verdict = name and backfill_verdict(name, slot)
      if verdict == 'hold' then
        -- Paused: looked at again a lease from now; a resume lets it go then.
        leases[#leases + 1] = deadline
        leases[#leases + 1] = member
        target = nil
      elseif verdict == 'drop' then
        served[#served + 1] = member
        unqueued[name] = unqueued[name] or {}
        table.insert(unqueued[name], slot)
        target = nil
      end
    end
    if target and target ~= member then  -- (nil: a backfilled slot held or dropped above)
      served[#served + 1] = member
      if redis.call('ZSCORE', KEYS[2], target) then target = nil end  -- in flight already
    end
    -- `held`: one lease per occurrence, however many members asked for it.
    if target and not held[target] then
      held[target] = true
      leases[#leases + 1] = deadline
      leases[#leases + 1] = target
      released[#released + 1] = member
    end
  end
end
-- Cluster slot migration: while the queue's slot is MIGRATING, a command on a key this
-- script emptied fails ("non local key": the server takes it for a key moved away) and the
-- writes made before it stay. Removing the served members first could empty the leases key
-- and lose the leases written after, with the slot and the trigger already consumed; so the
-- leases go in first, and the key is read no more if the removal emptied it.
zadd_all(KEYS[1], moves)
zadd_all(KEYS[2], leases)
local emptied = remove_served(KEYS[2], served, held)
forget_backfilled(unqueued)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local first_lease = {}
if not emptied then first_lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES') end
return {
  claimed, released, first[2] or '', first_lease[2] or '', replaced, skipped, buffered, dropped
}
