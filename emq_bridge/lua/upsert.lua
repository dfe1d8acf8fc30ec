-- upsert: register each item, or rewrite its record when its definition digest differs.
--
-- KEYS[1]      <prefix>:{q}:repeat          sorted set: name -> next run (epoch ms)
-- KEYS[2]      <prefix>:{q}:generations     hash: source -> highest generation synced
-- KEYS[3]      <prefix>:{q}:synced          hash: the sync stamps (stamp.lua)
-- KEYS[3 + i]  <prefix>:{q}:repeat:<name>   hash: the record of item i
-- ARGV[1]  wake channel (published to once if anything was written)
-- ARGV[2]  now, epoch ms (created_ms of a new record)
-- ARGV[3]  JSON array of items, one per record key (may be empty), each
--          [name, digest (covers the owner too), cadence digest, first run ms (a string),
--           [definition field, value, ...] (the script adds the digests, the stamps and the
--           owner: ARGV[2], ARGV[4]), the definition fields to delete (an index into
--           ARGV[6], or the list itself),
--           [seed field, value, ...] (written on create only: an importer's paused state
--           and counters; may be absent),
--           the first run of a created record when it differs from item 4 (`immediately`;
--           may be absent),
--           the pending slot: [slot, the instant the new cadence sends it at, the nominal
--           slot of the live score under the old cadence] ('' for any it has not; may be
--           absent: see digit 5),
--           the resumed slot: [the cadence digest and the live score the caller read, the
--           first slot at or after that score the new definition fires, or '' when its
--           slots differ from the old one's] (may be absent: see digit 6)]
-- ARGV[4]  the source the items belong to ('' for none)
-- ARGV[5]  the generation of that source's declarations ('' for none: no check)
-- ARGV[6]  JSON array of the distinct lists of fields to delete, which items name by their
--          index from 1 (may be absent): the items of a sync share a handful of them.
-- ARGV[7]  '1': never take over a record another source (or none) owns: such an item is
--          not written and its digit is 4 (an import; may be absent)
--
-- The items travel as one JSON argument: a boot sync of many schedules would otherwise
-- spend most of its client time encoding arguments.
-- Generation guard: when ARGV[5] is given and the queue holds a higher generation of the
-- source, nothing is written and the reply is '!' followed by that generation. Otherwise
-- the stored generation is raised to ARGV[5] (never lowered) in the same script as the
-- writes, so two syncs of different generations cannot interleave into a revert.
-- Each record written counts one write of its owner, and of its previous owner when the
-- owner changes, in KEYS[3]'s `{w}<source>` counter of each source that keeps one (a sync
-- that stamps, stamp.lua): a stamp holds only while its source's counter has not moved.
-- Returns one digit per item, as one string: 0 unchanged (nothing written), 1 created,
-- 2 updated, 4 left to its owner (ARGV[7]), 5 not written: its cadence changes, the old one
-- jittered (`jitter_ms`) and its next run is still ahead, so it may not have sent a slot
-- that is past for the new cadence: the caller sends the item again with the pending slot
-- (item 9), which the update then fires at once (at its new instant) if it is after the
-- last fired slot and within the old jitter's reach of the old score,
-- 3 updated with its cadence changed while its next run was overdue,
-- 6 not written: its cadence digest changes while its next run is overdue, or while it is
-- paused and its parked next run passed (`paused_next_ms`: the paused window): the caller
-- sends it again with the resumed slot (item 10; for a paused record, the new definition's
-- first slot at or after the parked one, and the parked slot read in place of the score),
-- 7 not written: its record key is of another
-- type than a hash (edited by hand), so neither a create nor an update can write it (the
-- caller names it), 8 unchanged, but its registry member was missing (evicted, or removed
-- by hand) and is put back: at +inf for a paused (or parked) or completed record, which is
-- where pause.lua and the completion leave it, else at its next run under its cadence, the
-- first slot after now (item 4, the caller's) and after its last fired slot (`after_fired`),
-- completing it past its bounds (`place`), 9 updated, and its missing registry member put
-- back as the update places it (a client parses one string faster than an array of
-- integers).
-- Overdue: the old cadence's slot at the live score (and those after it up to now) passed
-- with no pump to claim it. When only what bounds or excludes slots changed (a start or end,
-- an exclusion: the caller compares the slot-placing fields), the score goes to the first
-- slot at or after it that the new definition fires, still overdue, so the pump's misfire
-- policy handles it as it would have. When the slots themselves change, the new cadence
-- re-derives the next run, so the passed slots never fire: they are counted in `missed` (an
-- interval's exactly, a cron's or one-off's as one) and the digit 3 has the caller log
-- them, so no slot is dropped silently. The resumed slot holds only while the record's
-- cadence digest and score are those the caller read (compare-and-set).
-- An update keeps the score unless the cadence changed; a paused record stays paused
-- (score +inf). A record whose registry member went missing gets it back (repair: digit 8
-- when its definition is unchanged, 9 with the update).
-- A score never moves to a slot at or before the last fired one (`after_fired`).
-- Bounds (bounds.py): a created record with a `limit` gets `remaining` = limit; an update
-- that changes the limit moves `remaining` by the difference (below 0 when the limit goes
-- under the runs made: `rebase_limit`); any score
-- written past the record's last instant (`end_ms`, the last of `at`), or with no run left,
-- completes it (+inf, `completed`, `completed_ms`), as claim.lua does. A changed definition
-- of a completed record re-derives its next run, as a changed cadence does, so extending
-- its end or its limit brings it back.
local registry = KEYS[1]

-- A registry key of another type fails the call before anything is written (the scores of
-- created records are written last, in one ZADD, so it would fail only after their records);
-- so do a stamps key of another type (its counters are written last) and a generations key
-- of another type when a generation is given.
local registry_type = redis.call('TYPE', registry)['ok']
if registry_type ~= 'zset' and registry_type ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. registry .. ' is not a sorted set')
end
for i = ARGV[5] ~= '' and 2 or 3, 3 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is a ' .. kind .. ', not a hash')
  end
end

if ARGV[5] ~= '' then
  local live = redis.call('HGET', KEYS[2], ARGV[4])
  if live and tonumber(live) > tonumber(ARGV[5]) then return '!' .. live end
  if not live or tonumber(live) < tonumber(ARGV[5]) then
    redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
  end
end

-- The first run to write, or one after the record's last fired slot (claim.lua's
-- last_due_ms) if it is not: a first run derived from a `now` a pump has passed since (a sync
-- that stalled after reading the clock) may be at or before that slot, and a slot at it
-- would fire again. An interval steps on by whole intervals; a cron, which Lua cannot
-- compute, keeps `live`, its current next run (the claim of that slot put it after it), or,
-- with none (a member removed by hand), goes just after the last fired slot.
local function after_fired(record, first_run, live, last)
  last = tonumber(last)
  if not last or tonumber(first_run) > last then return first_run end
  local fields = redis.call('HMGET', record, 'every_ms', 'cron', 'at', 'exclude')
  if fields[3] then  -- one-off instants: the first after the last fired, if any
    for instant in string.gmatch(fields[3], '%d+') do
      if tonumber(instant) > last then return instant end
    end
    return first_run  -- none left: past the last instant, so the record completes
  end
  local every = tonumber(fields[1])
  -- (An interval with exclusions, calendars.py, is stepped like a cron: a whole interval
  -- on may be an excluded slot.)
  if every and every > 0 and (not fields[2] or fields[2] == '') and not fields[4] then
    local steps = math.floor((last - tonumber(first_run)) / every) + 1
    return string.format('%d', tonumber(first_run) + steps * every)
  end
  if tonumber(live) and tonumber(live) > last then return live end
  return string.format('%d', last + 1)
end

-- A change that keeps an interval but moves its phase (its anchor or offset: an imported
-- schedule's rhythm taken over by a declaration on the grid, a version-1 record) runs no
-- sooner than one interval after its last run (`prior`: the last slot fired, else, for a
-- record an importer seeded, the old scheduler's last run): the first slot of the new phase
-- at or after that. Any other change keeps the grid rule (after_fired). Not for a jittered,
-- excluding or cron record, nor one a Celery schedule decides (`cadence_label`: its
-- `every_ms` is only when to check it). `old` holds the record's anchor and offset before
-- the write.
local function not_sooner(record, first_run, old_every, old, prior)
  local f = redis.call('HMGET', record, 'every_ms', 'cron', 'at', 'exclude', 'jitter_ms',
                       'cadence_label', 'anchor', 'offset_ms')
  local every = tonumber(f[1])
  if not every or every ~= old_every or (f[2] and f[2] ~= '') or f[3] or f[4] or f[5]
      or f[6] then
    return first_run
  end
  if (f[7] or '') == (old[1] or '') and (f[8] or '') == (old[2] or '') then
    return first_run  -- the same phase: a bound or a policy changed
  end
  local first, floor = tonumber(first_run), prior + every
  if not first or first >= floor then return first_run end
  return string.format('%d', first + math.ceil((floor - first) / every) * every)
end

-- The reason `record` is complete with the next score `score`, or nil (claim.lua's rule).
local function completion(record, score)
  local f = redis.call('HMGET', record, 'end_ms', 'at', 'remaining', 'limit')
  if f[4] and tonumber(f[3]) and tonumber(f[3]) <= 0 then return 'limit' end
  local n = tonumber(score)
  local last_at = f[2] and tonumber(string.match(f[2], '(%d+)$'))
  if last_at and n > last_at then return 'at' end
  if tonumber(f[1]) and n > tonumber(f[1]) then return 'end_at' end
  return nil
end

-- The score to write for the next run `score`: itself, or +inf when it completes the record.
local function place(record, score)
  local reason = completion(record, score)
  if not reason then return score end
  redis.call('HSET', record, 'completed', reason, 'completed_ms', ARGV[2])
  return '+inf'
end

-- Set `remaining` after the limit went from `before` to the record's `limit` now. It goes
-- below 0 when the limit is lowered under the runs made (the registration completes): the
-- runs made stay `limit - remaining`, so raising the limit again gives back only the
-- difference to them, never a run past the limit. Readers show less than 0 as 0.
local function rebase_limit(record, before, remaining)
  local limit = redis.call('HGET', record, 'limit')
  if not limit then
    redis.call('HDEL', record, 'remaining')
  elseif limit ~= before then
    local left = tonumber(limit)
    if before and tonumber(remaining) then left = tonumber(remaining) + left - tonumber(before) end
    redis.call('HSET', record, 'remaining', string.format('%d', left))
  end
end

-- True when `fields` (field, value, ...) hold a bound a created record must apply: a
-- limit, an end or one-off instants (else `rebase_limit` and `place` change nothing).
local function bounded(fields)
  for j = 1, #fields, 2 do
    local f = fields[j]
    if f == 'limit' or f == 'end_ms' or f == 'at' then return true end
  end
  return false
end

local shapes = ARGV[6] and cjson.decode(ARGV[6]) or {}

-- Writes per owner, for the `{w}<source>` counters of the sync stamps (added up at the end).
local writes = {}
local function wrote_for(owner)
  if owner and owner ~= '' then writes[owner] = (writes[owner] or 0) + 1 end
end

-- Write the item's digests, the update stamp, the owner (if any) and its definition fields.
local function write(record, digest, cadence_digest, ...)
  if ARGV[4] ~= '' then
    redis.call('HSET', record, 'digest', digest, 'cadence_digest', cadence_digest,
               'updated_ms', ARGV[2], 'source', ARGV[4], ...)
  else
    redis.call('HSET', record, 'digest', digest, 'cadence_digest', cadence_digest,
               'updated_ms', ARGV[2], ...)
  end
end

-- The registry scores of the records created since the last flush, written by one ZADD:
-- a boot that creates many records spares a command per record. Flushed before any item
-- that is not a create (the same name twice in one call reads its score) and at the end.
local created, nc = {}, 0
local function flush_created()
  if nc > 0 then
    redis.call('ZADD', registry, unpack(created, 1, nc))
    nc = 0
  end
end

local function upsert(record, item)
  local name, digest, cadence_digest, first_run, fields, stale, seed =
    item[1], item[2], item[3], item[4], item[5], item[6], item[7]
  if type(stale) == 'number' then stale = shapes[stale] end
  -- One command, as EXISTS was: a key of another type would fail its first write midway
  -- through the call, after the items before it were written.
  local kind = redis.call('TYPE', record)['ok']
  if kind ~= 'none' and kind ~= 'hash' then return 7 end
  if kind == 'none' then
    write(record, digest, cadence_digest, 'created_ms', ARGV[2], unpack(fields))
    first_run = item[8] or first_run
    if bounded(fields) then
      rebase_limit(record, nil, nil)
      first_run = place(record, first_run)
    end
    local paused = false
    if seed and #seed > 0 then
      redis.call('HSET', record, unpack(seed))
      paused = redis.call('HGET', record, 'paused') == '1'
    end
    created[nc + 1], created[nc + 2] = paused and '+inf' or first_run, name
    nc = nc + 2
    if nc >= 1000 then flush_created() end  -- within unpack's bound
    return 1
  end
  flush_created()
  local cur = redis.call(
    'HMGET', record, 'digest', 'cadence_digest', 'paused', 'paused_next_ms', 'last_due_ms',
    'limit', 'remaining', 'completed', 'every_ms', 'cron', 'at', 'source', 'jitter_ms',
    'last_fired_ms', 'anchor', 'offset_ms'
  )
  if cur[12] ~= ARGV[4] and ARGV[7] == '1' then return 4 end  -- another owner's: left alone
  local paused, last, completed = cur[3] == '1', cur[5], cur[8]
  local old_every = (not cur[10] or cur[10] == '') and not cur[11] and tonumber(cur[9])
  local live = redis.call('ZSCORE', registry, name)
  local missing = not live  -- its member went missing (evicted, removed by hand): put back
  if cur[1] == digest then
    -- Unchanged. Only repair a record whose registry member went missing (digit 8).
    if live then return 0 end
    local score = '+inf'
    if not (paused or completed) then score = place(record, after_fired(record, first_run, nil, last)) end
    redis.call('ZADD', registry, score, name)
    return 8
  end
  local old_jitter = tonumber(cur[13])
  local ahead = old_jitter and tonumber(live) and tonumber(live) > tonumber(ARGV[2])
  if ahead and cur[2] ~= cadence_digest and not paused and not completed and not item[9] then
    return 5  -- nothing written: the caller sends it again with its pending slot
  end
  local overdue = tonumber(live) and tonumber(live) <= tonumber(ARGV[2])
  -- A paused record whose parked next run passed: the slots since are its paused window.
  local window = paused and tonumber(cur[4]) and tonumber(cur[4]) <= tonumber(ARGV[2])
  local resumed = type(item[10]) == 'table' and item[10]
  if (overdue and not paused or window) and cur[2] ~= cadence_digest and not completed
      and not resumed then
    return 6  -- nothing written: the caller sends it again with the slot it resumes at
  end
  if cur[12] ~= ARGV[4] then wrote_for(cur[12]) end  -- a takeover (or a release) changes it
  -- The pieces of a template stored in pieces (template_pieces.py) go with it; the new
  -- fields write the new template's own.
  local pieces = tonumber(redis.call('HGET', record, 'template_pieces'))
  write(record, digest, cadence_digest, unpack(fields))
  -- The old pieces and the stale fields are deleted after the write, but those it wrote
  -- (a piece the new template has too), as when the delete came first: cluster slot
  -- migration: while the queue's slot is MIGRATING, a command on a key this script emptied
  -- fails ("non local key": the server takes it for a key moved away) with the writes before
  -- it kept. The record keeps the digests just written, so it never empties.
  local written = {digest = true, cadence_digest = true, updated_ms = true}
  if ARGV[4] ~= '' then written.source = true end
  for j = 1, #fields, 2 do written[fields[j]] = true end
  local gone = {}
  if pieces and pieces > 1 then
    -- At most MAX_PIECES (32), the most a template is written in: a count edited by hand
    -- (even 'inf') is no loop.
    for n = 2, math.min(pieces, 32) do
      if not written['template.' .. n] then gone[#gone + 1] = 'template.' .. n end
    end
  end
  for _, field in ipairs(stale) do
    if not written[field] then gone[#gone + 1] = field end
  end
  if #gone > 0 then redis.call('HDEL', record, unpack(gone)) end
  rebase_limit(record, cur[6], cur[7])
  if completed then
    redis.call('HDEL', record, 'completed', 'completed_ms')
    live = nil
  end
  if cur[2] ~= cadence_digest or completed then
    if paused then
      -- Its paused window, if one passed, starts at the new definition's first slot at or
      -- after the parked one (the caller's, while the cadence digest and the parked slot
      -- are those it read), so a resume with catch-up still hands it to the misfire policy.
      local from = first_run
      if window and resumed and resumed[3] ~= '' and cur[2] == resumed[1]
          and (cur[4] or '') == resumed[2] then
        from = resumed[3]
      end
      local parked = after_fired(record, from, cur[4], last)
      place(record, parked)  -- marks it completed if it is; it stays paused
      redis.call('HSET', record, 'paused_next_ms', parked)
      redis.call('ZADD', registry, '+inf', name)
    elseif resumed and resumed[3] ~= '' and not completed and cur[2] == resumed[1]
        and tonumber(live) and tonumber(live) == tonumber(resumed[2]) then
      -- Only what bounds or excludes slots changed, and nothing moved since the caller read
      -- the record: the first slot at or after the live score that the new definition fires
      -- (the live one, unless it is excluded now), still overdue. Nothing is dropped: a slot
      -- passed over is one the new definition excludes.
      redis.call('ZADD', registry, place(record, after_fired(record, resumed[3], live, last)), name)
    else
      -- The slot the old, jittered cadence had not sent yet, past for the new one: fired now.
      local pending = ahead and type(item[9]) == 'table' and item[9]
      local taken = false
      if pending and tonumber(pending[1]) then
        local slot = tonumber(pending[1])
        if slot <= tonumber(ARGV[2]) and slot >= tonumber(live) - old_jitter
            and (not tonumber(last) or slot > tonumber(last)) then
          first_run = pending[2]
          taken = true
        end
      end
      local prior = tonumber(last) or tonumber(cur[14])
      if not taken and old_every and old_every > 0 and not old_jitter and prior then
        first_run = not_sooner(record, first_run, old_every, {cur[15], cur[16]}, prior)
      end
      local next_run = place(record, after_fired(record, first_run, live, last))
      redis.call('ZADD', registry, next_run, name)
      -- The old cadence's slot whose jittered send was still ahead (pending[3], the nominal
      -- slot of `live`), past now and not fired: when the new cadence fires no slot for it,
      -- the change drops it, counted in `missed` as an overdue slot a change drops is.
      local unsent = pending and tonumber(pending[3])
      if unsent and not taken and unsent <= tonumber(ARGV[2])
          and (not tonumber(last) or unsent > tonumber(last)) then
        local result = redis.pcall('HINCRBY', record, 'missed', 1)
        if type(result) == 'table' and result.err then redis.call('HSET', record, 'missed', 1) end
        return 3
      end
      if overdue and next_run ~= live then
        local dropped = 1
        if old_every and old_every > 0 then
          dropped = 1 + math.floor((tonumber(ARGV[2]) - tonumber(live)) / old_every)
        end
        -- A counter edited by hand into a non-integer restarts (claim.lua's `count`).
        local result = redis.pcall('HINCRBY', record, 'missed', dropped)
        if type(result) == 'table' and result.err then redis.call('HSET', record, 'missed', dropped) end
        return 3
      end
    end
  elseif not live then
    local score = '+inf'
    if not paused then score = place(record, after_fired(record, first_run, nil, last)) end
    redis.call('ZADD', registry, score, name)
  elseif not paused then
    -- The score stays; a lower limit may complete the record.
    redis.call('ZADD', registry, place(record, live), name)
  end
  if missing then return 9 end  -- updated, and its missing member put back
  return 2
end

-- The digits of an item written (created, updated, its member restored): 0, 4, 5, 6 and 7
-- wrote nothing, and a stamp counts what a sync writes (5 and 6 are written by the call that
-- sends them again).
local WROTE = {[1] = true, [2] = true, [3] = true, [8] = true, [9] = true}
local results, written = {}, false
for i, item in ipairs(cjson.decode(ARGV[3])) do
  results[i] = upsert(KEYS[3 + i], item)
  if WROTE[results[i]] then
    written = true
    wrote_for(ARGV[4])
  end
end
flush_created()
for owner, n in pairs(writes) do
  local counter = '{w}' .. owner
  if redis.call('HEXISTS', KEYS[3], counter) == 1 then
    -- A counter edited by hand into a non-integer restarts (claim.lua's `count`): it moved.
    local result = redis.pcall('HINCRBY', KEYS[3], counter, n)
    if type(result) == 'table' and result.err then redis.call('HSET', KEYS[3], counter, n) end
  end
end
if written then redis.pcall('PUBLISH', ARGV[1], 'upsert') end
return table.concat(results)
