-- report: apply what workers tell of occurrences (outcome.Report): started, succeeded,
-- failed, retrying, skipped, revoked, heartbeat, waiting (the heartbeat of a copy a worker
-- holds unstarted). One call per queue for a batch of reports.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run (pause on failures)
-- KEYS[2]  <prefix>:{q}:leases          sorted set: lease member -> deadline (buffered slots)
-- KEYS[3]  <prefix>:{q}:running         sorted set: occurrence in flight -> lost deadline
-- KEYS[2 + 2i], KEYS[3 + 2i]  the record and the history list of report i
-- ARGV[1]  JSON array of reports, each [kind, member, id, due_ms, attempt, at_ms,
--          released_ms or '', redelivered 0|1, triggered 0|1, error, hold_ms, started_ms
--          or '', task_ran, backfill 0|1], the last two optional (the common report, and
--          any of an older worker, ends at `started_ms`: its task ran, no backfill sent it)
--          (`started_ms`: a final report that carries its own start; `task_ran`, absent or
--          anything but 0/false: the task ran, 0 only for a `failed` or `skipped` copy that
--          never reached its task; `backfill` 1: a backfill sent it, for a past slot)
--          (`member` is the occurrence's "<name> <due_ms>[ triggered]"; `at_ms` the
--          worker's clock, used for durations; deadlines use this server's clock)
-- ARGV[2]  the history's length cap
-- ARGV[3]  heartbeat TTL, ms: a running occurrence not heard of for that long is lost
-- ARGV[4]  the start timeout, ms: the lost deadline, from now, of a buffered slot released to
--          be sent, and of a retry after its countdown
-- ARGV[5]  wake channel
--
-- A report whose history key is of another type (written by hand) is not applied, and the
-- others are: one registration's garbage does not drop its queue's reports.
-- Idempotent: an occurrence's entry (found by id in its history) is changed only by a report
-- that outranks it: a later attempt, or in the same attempt lost < running < retrying < a
-- final status (succeeded, failed, skipped, revoked): an attempt a framework retried without
-- counting it (a requeue) still ends on its final report. A repeated report changes nothing; so
-- do a report of a registration gone (nothing is created) and a heartbeat of an occurrence
-- no longer in flight.
-- On a final status: the occurrence leaves `running`; if it was the registration's
-- `inflight` one, a `buffered` slot is released (as the pending lease "<name> <due>
-- buffered", score 0, and is in flight at once); `failed` adds 1 to `failures` (`succeeded`
-- clears it) and pauses the registration once `failures` reaches `pause_after_failures`,
-- unless its task never ran (`task_ran` 0: no worker had it, as an old worker meets a new
-- task's message in a rolling deploy): that one neither counts nor clears the streak;
-- `skipped` adds 1 to the `skipped` count (once per occurrence).
-- An occurrence a backfill sent (the report says `backfill` 1, or its history entry, the 11th
-- element, does: a later report from an older worker) is out of band: its entry is kept (and
-- marked) and it is in `running` while it runs (heartbeated, lost when they stop), but it is
-- never the record's `inflight` nor in `inflight_also` (the overlap policy neither waits for
-- it nor replaces it), and none of its reports moves the live schedule's `last_*` fields,
-- `failures` or pause; the `skipped` count still counts it.
-- Returns {the number of reports applied, then the ids of the heartbeats' runs a `replace`
-- took over (claim.lua's `replaced_runs`): the worker stops them}.
-- `lost` is lower than `running`: a worker that starts an occurrence the pump gave up on
-- (a redelivery after its heartbeats stopped) has it in flight again. A `started` of the
-- attempt running, at a later time, is the same attempt started again by another worker: it
-- moves the start (a repeated report, same time, changes nothing).
local RANK = {lost = 0, running = 1, retrying = 3, succeeded = 4, failed = 4, skipped = 4,
              revoked = 4}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reports = cjson.decode(ARGV[1])
local cap, ttl, start_ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local registry, leases, running = KEYS[1], KEYS[2], KEYS[3]

-- #include running

-- Find the history entry of `id`: its 0-based index and its decoded array, or nil. The
-- entry of a report is nearly always among the newest, so those are read first.
local function find(history, id)
  local prefix = '["' .. id .. '"'
  local offset = 0
  for _, range in ipairs({{0, 7}, {8, -1}}) do
    local items = redis.pcall('LRANGE', history, range[1], range[2])
    if items.err then return nil, nil end  -- not a list: its write below refuses the report
    for index, raw in ipairs(items) do
      if string.sub(raw, 1, #prefix) == prefix then
        return offset + index - 1, cjson.decode(raw)
      end
    end
    offset = 8
  end
  return nil, nil
end

-- A guarded registration's occurrences in flight besides its `inflight` one (a manual trigger
-- started while a slot runs, whatever the policy), newline-separated in `inflight_also`, at
-- most ALSO_MAX: when the `inflight` one ends, the first of them still live takes its place,
-- so the registration stays in flight while any of them runs (claim.lua and begin.lua read
-- both fields).
local ALSO_MAX = 16
local function members_of(raw)
  local out = {}
  if raw then
    for member in string.gmatch(raw, '[^\n]+') do out[#out + 1] = member end
  end
  return out
end
local function live(member)
  local deadline = running_score(member)
  return deadline and tonumber(deadline) > now
end

local function release_buffered(record, name)
  local slot = redis.call('HGET', record, 'buffered')
  if not slot then return end
  redis.call('HDEL', record, 'buffered')
  if redis.call('HGET', record, 'paused') == '1' then
    -- Paused (by hand, or by this very report's failure streak): the slot that waited is
    -- not sent, as no slot is while paused; it is counted missed.
    local counted = redis.pcall('HINCRBY', record, 'missed', 1)
    if type(counted) == 'table' and counted.err then redis.call('HSET', record, 'missed', 1) end
    return
  end
  local member = name .. ' ' .. slot
  -- Released is fired: its slot is the last fired one, and the one before is its previous.
  local previous = redis.call('HGET', record, 'last_due_ms') or ''
  if tonumber(previous) and tonumber(previous) >= tonumber(slot) then
    -- Later slots fired meanwhile (the policy was edited to allow): `last_due_ms` never
    -- moves back (the guards against firing a slot again read it), and the slot fired
    -- before this one is not known.
    redis.call('HSET', record, 'inflight', member, 'buffered_previous_ms', '')
  else
    redis.call('HSET', record, 'inflight', member, 'last_due_ms', slot,
               'buffered_previous_ms', previous)
  end
  enter_running(now + start_ttl, member)
  redis.call('ZADD', leases, 'NX', 0, member .. ' buffered')
  redis.pcall('PUBLISH', ARGV[5], name)
end

local function pause_after_failures(record, name, failures, error)
  local limit = tonumber(redis.call('HGET', record, 'pause_after_failures'))
  if not limit or failures < limit or redis.call('HGET', record, 'paused') == '1' then return end
  local score = redis.call('ZSCORE', registry, name)
  local reason = 'paused after ' .. failures .. ' consecutive failures'
  if error ~= '' then reason = reason .. '; last: ' .. error end
  redis.call('HSET', record, 'paused', '1', 'paused_next_ms', score or '',
             'parked_reason', reason, 'parked_ms', now)
  redis.call('ZADD', registry, '+inf', name)
  redis.pcall('PUBLISH', ARGV[5], name)
end

-- One table of HSET arguments and one of HDEL fields, reused by every report (`ns`, `nd`
-- their lengths): a report builds no table but its history entry.
local sets, drop, ns, nd = {}, {}, 0, 0
local function set(field, value)
  sets[ns + 1], sets[ns + 2] = field, value
  ns = ns + 2
end

local applied, replaced = 0, {}
for i, report in ipairs(reports) do
  local kind, member, id, due, attempt, at, released, redelivered, triggered, error, hold,
        started_at, task_ran, backfilled = unpack(report)
  local record, history = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  -- One read of what the record says: whether it exists, the newest nominal time its history
  -- holds (`history_due`: a report of a later occurrence has no entry yet, so no search), the
  -- occurrence in flight, whether there is a failure streak to clear, and the overlap policy.
  local cur = redis.pcall('HMGET', record, 'template', 'history_due', 'inflight', 'failures',
                          'overlap', 'inflight_also', 'last_success_ms', 'replaced_runs')
  if type(cur) == 'table' and not cur.err and cur[1] then
    if kind == 'heartbeat' then
      -- (A member held out is gone: XX leaves it out.)
      if member ~= held_out then
        if redis.call('ZADD', running, 'XX', 'CH', now + ttl, member) == 1 then
          applied = applied + 1
        end
        -- A run a `replace` took over (claim.lua keeps those in `replaced_runs`), still in
        -- flight, whose revoke did not reach its worker (one in warm shutdown reads no
        -- remote control; or it waited unstarted, and started after): the reply names it.
        if cur[8] and string.find('\n' .. cur[8] .. '\n', '\n' .. member .. '\n', 1, true)
            and running_score(member) then
          replaced[#replaced + 1] = id
        end
      end
    elseif kind == 'waiting' then
      -- A copy a worker holds unstarted keeps the occurrence in flight only while no run of
      -- its attempt (or a later one) has begun: begin.lua's `inflight_run` mark, or a history
      -- entry of that attempt or a later one. A copy waiting while its run runs (or ran, on a
      -- worker since killed) elsewhere must not keep that run in flight: its own heartbeats
      -- do, and lost once they stop. `hold` (a worker that stops, handing the message back
      -- to its broker): in flight that long from now instead of the heartbeat TTL.
      if running_score(member) then
        local mine = tonumber(attempt)
        local run_id, run_attempt = string.match(redis.call('HGET', record, 'inflight_run')
                                                 or '', '^(%S+) (%d+)$')
        local begun = run_id == id and tonumber(run_attempt) >= mine
        if not begun then
          local _, entry = find(history, id)
          begun = entry ~= nil and (tonumber(entry[7]) or 0) >= mine
        end
        local hold_ms = tonumber(hold) or 0
        if hold_ms <= 0 then hold_ms = ttl end
        if not begun then
          redis.call('ZADD', running, 'XX', now + hold_ms, member)
          applied = applied + 1
        end
      end
    else
      local status = kind
      if kind == 'started' then status = 'running' end
      local index, entry
      local newest = tonumber(cur[2])
      local later = not newest or tonumber(due) > newest
      if not later then index, entry = find(history, id) end
      local fresh = entry == nil
      -- A copy skipped or revoked (refused at its start or on receipt) of an occurrence the
      -- history no longer holds: older than its oldest entry, the history full. Its run
      -- ended, or was lost, long ago (a killed worker's message its broker gave back minutes
      -- later), and its entry was trimmed: a fresh `skipped` entry, counted, would say of an
      -- occurrence that ran that it never started.
      local forgotten = false
      if fresh and not later and (status == 'skipped' or status == 'revoked') then
        local kept = redis.pcall('LLEN', history)
        if type(kept) == 'number' and kept >= cap then
          local oldest = redis.call('LINDEX', history, -1)
          local ok, decoded = pcall(cjson.decode, oldest or '')
          forgotten = ok and type(decoded) == 'table'
            and tonumber(due) < (tonumber(decoded[2]) or -math.huge)
        end
      end
      if fresh then
        entry = {id, due, released, '', '', status, attempt, redelivered, triggered, ''}
      end
      local old_attempt, old_rank = tonumber(entry[7]), RANK[entry[6]] or 0
      -- Out of band (see above): a backfill sent it.
      local backfill = backfilled == 1 or entry[11] == 1
      -- The same attempt started again while it runs: the broker gave the message to another
      -- worker (RabbitMQ redelivers a dead consumer's at once), so its run starts then. The
      -- start a report carries: its own (`started`), or the one folded into a final report.
      local carried = started_at
      if kind == 'started' then carried = at end
      local restarted = attempt == old_attempt and old_rank == RANK.running and carried
        and carried ~= '' and tonumber(carried) > (tonumber(entry[4]) or math.huge)
      -- A copy of a lost occurrence skipped by the overlap check (a redelivery; a Celery
      -- worker revokes it on receipt) leaves it lost: nothing ran, and the loss is what
      -- happened to it (a revoke would also give it the lost run's start as its own). A
      -- later attempt skipped or revoked (a retry revoked while it waited for its countdown,
      -- marked lost meanwhile) is what happened to the occurrence: it is told.
      local hides_loss = (status == 'skipped' or status == 'revoked') and entry[6] == 'lost'
        and attempt <= old_attempt
      -- A copy that never reached its task (`task_ran` 0: skipped before its start, or its
      -- actor unknown to an old worker) does not end the same attempt running elsewhere (a
      -- broker's redelivery of a message another worker still runs).
      local unrun_copy = (task_ran == 0 or task_ran == false) and entry[6] == 'running'
        and attempt == old_attempt
      -- The same attempt run after a worker skipped it, a start later than the skip: a copy
      -- a middleware postponed (`SkipMessage`, and the message enqueued again). What that run
      -- reports is what happened. Only a skip gives way so: a second delivery of a run that
      -- ended otherwise (at least once: an ack lost with its worker) would count its failure
      -- twice, or flip a success. (A guarded registration's worker drops such a copy before
      -- it runs: begin.lua.) A final report carrying its start (folded) reruns as that
      -- start, sent alone, would have: whatever its own status, a skip included.
      local rerun = attempt == old_attempt and entry[6] == 'skipped'
        and (status ~= 'skipped' or (kind ~= 'started' and started_at and started_at ~= ''))
        and carried and carried ~= '' and tonumber(entry[5])
        and tonumber(carried) > tonumber(entry[5])
      -- A skip from before the run in hand started (a report of it sent again) is stale.
      local stale_skip = status == 'skipped' and entry[6] == 'running'
        and attempt == old_attempt and tonumber(entry[4]) and tonumber(at) < tonumber(entry[4])
      if not hides_loss and not unrun_copy and not stale_skip and not forgotten
          and (fresh or attempt > old_attempt
          or (attempt == old_attempt and RANK[status] > old_rank)
          or (kind == 'started' and restarted) or rerun) then
        applied = applied + 1
        -- A folded start counts where a `started` report alone would have applied.
        local take_start = fresh or attempt > old_attempt or old_rank < RANK.running or restarted
          or rerun
        local folded = started_at and started_at ~= '' and take_start
        local was = fresh and '' or entry[6]
        local was_lost = was == 'lost'
        if folded then was = 'running' end  -- as after its start, sent alone
        -- An attempt skipped, then run (`rerun`), is marked (a 12th element): a skip of that
        -- run again is the same occurrence's, counted once (a later attempt starts afresh).
        if not fresh and attempt > old_attempt then entry[12] = nil end
        if rerun then entry[11], entry[12] = entry[11] or 0, 1 end
        local skip_counted = was == 'skipped' or entry[12] == 1
        entry[6], entry[7] = status, attempt
        if released ~= '' then entry[3] = released end
        if redelivered == 1 then entry[8] = 1 end
        if backfill then entry[11] = 1 end
        if kind == 'started' then
          entry[4], entry[5], entry[10] = at, '', ''
        else
          -- A start the report carries (the reporter folded it in, or the adapter saw it). A
          -- later attempt's end without one (a retry revoked before its countdown ended)
          -- has no start: not the earlier attempt's, which would make a duration of the wait.
          if folded then
            entry[4] = started_at
          elseif not fresh and attempt > old_attempt then
            entry[4] = ''
          end
          entry[5], entry[10] = at, error
        end
        local encoded = cjson.encode(entry)
        ns, nd = 0, 0
        if not backfill then  -- the live schedule's last occurrence
          sets[1], sets[2], sets[3], sets[4], sets[5], sets[6] =
            'last_status', status, 'last_id', id, 'last_due', due
          ns = 6
        end
        local wrote
        if index then
          wrote = redis.pcall('LSET', history, index, encoded)
        else
          -- Trimmed only once it is past the cap (a full history: every time; a command
          -- spared while it fills).
          wrote = redis.pcall('LPUSH', history, encoded)
          if type(wrote) == 'number' and wrote > cap then
            redis.call('LTRIM', history, 0, cap - 1)
          end
          if later then set('history_due', due) end
        end
        -- A history key of another type (written by hand) refuses this report alone, before
        -- anything of it is written: the other reports of the batch are applied.
        local refused = type(wrote) == 'table' and wrote.err ~= nil
        -- Any other refusal is the server's, not this key's: out of memory (a server refuses
        -- a script's writes for memory only until its first), a read-only replica (a
        -- client still on a demoted master, or pointed at a replica). This is the call's
        -- first write, so nothing is written yet: the whole call fails with the server's
        -- error (an outage to the reporter, which keeps the batch), rather than the
        -- reports being skipped as applied by no one.
        if refused and string.sub(wrote.err, 1, 10) ~= 'WRONGTYPE ' then
          return redis.error_reply(wrote.err)
        end
        if was_lost and not refused then
          -- Heard from after a pump marked it lost (its worker was cut off, not gone): it
          -- counts as lost no more, as its entry says (`lost` counts those still lost).
          local lost = tonumber(redis.pcall('HGET', record, 'lost'))
          if lost and lost > 0 then redis.call('HINCRBY', record, 'lost', -1) end
        end
        if refused then applied = applied - 1 end
        local inflight = cur[3]
        if refused then
          -- the record is left as it was
        elseif kind == 'started' then
          enter_running(now + ttl, member)
          -- A backfilled one (out of band): only its history entry and `running`.
          if not backfill then
            set('last_started_ms', at)
            if not (inflight and inflight ~= member and live(inflight)) then
              set('inflight', member)
            else  -- another occurrence runs: in flight beside it, whatever the policy (an
              -- edit to a guarded one must still see it: its claim and begin read this)
              local also, known = members_of(cur[6]), false
              for _, other in ipairs(also) do known = known or other == member end
              if not known then
                also[#also + 1] = member
                if #also > ALSO_MAX then table.remove(also, 1) end
                set('inflight_also', table.concat(also, '\n'))
              end
            end
          end
          if ns > 0 then redis.call('HSET', record, unpack(sets, 1, ns)) end
        elseif kind == 'retrying' then
          -- In flight until its next attempt starts: the retry's countdown, then as long as a
          -- sent occurrence may wait in the broker for a free worker (the start timeout),
          -- since the retry waits in the queue as a fresh send does; then heartbeats.
          enter_running(now + tonumber(hold) + math.max(ttl, start_ttl), member)
          if error ~= '' and not backfill then set('last_error', error) end
          if ns > 0 then redis.call('HSET', record, unpack(sets, 1, ns)) end
        else
          -- Only a report of this occurrence (which makes its entry, so it is not `later`), a
          -- guarded claim or a buffered slot's release (both set `inflight`; `overlap` names the
          -- policy) put it in `running`: an unguarded occurrence's first report has nothing to
          -- remove there, and spares the command (a folded start and end is such a report).
          -- A backfilled one is in `running` from its start, guarded or not.
          if backfill or not (later and not inflight and not cur[5]) then
            leave_running(member)
          end
          local started = tonumber(entry[4])
          if backfill then
            -- out of band: the live schedule's last run, streak and pause stay as they are
          elseif started then
            set('last_finished_ms', at)
            if folded then set('last_started_ms', started) end
            set('last_duration_ms', math.max(0, tonumber(at) - started))
          else  -- never reported started: no duration, not the one of an earlier occurrence
            set('last_finished_ms', at)
            nd = nd + 1
            drop[nd] = 'last_duration_ms'
          end
          local failures = 0
          if backfill then
            if status == 'skipped' and not skip_counted then
              redis.pcall('HINCRBY', record, 'skipped', 1)
            end
          elseif status == 'succeeded' then
            -- The latest success, whatever order two workers' reports arrive in.
            local known = tonumber(cur[7])
            if not known or tonumber(at) >= known then
              set('last_success_ms', at)
              set('last_success_due_ms', due)
            end
            if cur[4] then
              nd = nd + 1
              drop[nd] = 'failures'
            end
          elseif status == 'failed' then
            -- A task that never ran (its worker did not have it) is no failure of the task:
            -- the streak stays as it was, and nothing pauses.
            if task_ran ~= 0 and task_ran ~= false then
              local counted = redis.pcall('HINCRBY', record, 'failures', 1)
              if type(counted) == 'table' and counted.err then counted = 1 end
              failures = counted
              set('failures', failures)
            end
            set('last_error', error)
            set('last_failure_ms', at)
          elseif status == 'skipped' and not skip_counted then
            -- A worker skipped it (its overlap check at start, Dramatiq's SkipMessage or
            -- AgeLimit, Celery's Ignore): counted as the pump's skips are.
            redis.pcall('HINCRBY', record, 'skipped', 1)
          end
          -- The occurrences in flight beside it: this one leaves them, and when it was the
          -- `inflight` one, the first of them still live takes its place.
          local promoted = nil
          if cur[6] then
            local kept = {}
            for _, other in ipairs(members_of(cur[6])) do
              if other ~= member and live(other) then
                if inflight == member and not promoted then
                  promoted = other
                else
                  kept[#kept + 1] = other
                end
              end
            end
            if #kept > 0 then
              set('inflight_also', table.concat(kept, '\n'))
            else
              nd = nd + 1
              drop[nd] = 'inflight_also'
            end
          end
          if inflight == member and promoted then
            set('inflight', promoted)
          elseif inflight == member then
            drop[nd + 1], drop[nd + 2] = 'inflight', 'inflight_run'  -- begin.lua's mark
            nd = nd + 2
          end
          if ns > 0 then redis.call('HSET', record, unpack(sets, 1, ns)) end
          if nd > 0 then redis.call('HDEL', record, unpack(drop, 1, nd)) end
          local freed = inflight == member and not promoted
          local name = (failures > 0 or freed) and string.match(member, '^(%S+)')
          if failures > 0 then pause_after_failures(record, name, failures, error) end
          if freed then release_buffered(record, name) end
        end
      end
    end
  end
end
running_done()
table.insert(replaced, 1, applied)
return replaced
