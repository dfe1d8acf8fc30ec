-- claim: compare-and-set claim of due registrations, and re-lease of expired leases.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:leases          sorted set: lease member -> lease deadline (keys.py)
-- KEYS[3 .. 2+n]  <prefix>:{q}:repeat:<name> records, one per candidate
-- KEYS[3+n]  <prefix>:{q}:running      sorted set: occurrence in flight -> lost deadline
-- KEYS[4+n ..]  <prefix>:{q}:history:<name> lists of the guarded candidates (see below)
-- ARGV[1]  now, epoch ms
-- ARGV[2]  lease deadline, epoch ms
-- ARGV[3]  JSON array of the n candidates, each [name, score read by scan, next score,
--          missed, mode (, history key index, occurrence id)], numbers as decimal strings
--          mode 'fire': move the score, lease the occurrence, note its slot (`last_due_ms`)
--          and count its missed slots; `fired` is counted when it is acked (ack.lua)
--          mode 'defer': only move the score (a corrupt record is parked)
--          mode 'skip' | 'buffer_one' | 'replace': the overlap policy of a guarded
--          registration (definition.py): fire as 'fire' unless an occurrence of it is in
--          flight, i.e. its record's `inflight` member holds a live deadline in `running`.
--          Then 'skip' only moves the score, counts `skipped` and notes the slot in the
--          history (KEYS[history key index]) under the occurrence id given; 'buffer_one'
--          keeps the slot in the record's `buffered` field (report.lua and lost.lua release
--          it when the running one ends), or skips it if one is kept already; 'replace'
--          fires and returns the member in flight, for the pump to revoke. A guarded
--          occurrence fired is in flight at once: `inflight`, and `running` for ARGV[5] ms.
--          Deadlines in `running` are on this server's clock (TIME), whatever the pump's.
-- ARGV[4]  JSON array of expired lease members to re-lease, as scan read them
-- ARGV[5]  how long a guarded occurrence fired stays in flight until a worker reports its
--          start, ms
-- ARGV[6]  the history's length cap
-- (Two JSON arguments rather than thousands of plain ones: the client packs them cheaply.)
--
-- A candidate is claimed only if its score is still the one scan read, so two pumps never
-- claim the same occurrence; its score moves to the next run in the same step.
-- An expired member is re-leased only if it is still there and expired, so two pumps never
-- re-lease the same one. A pending trigger "<name> <due_ms> manual" (trigger.lua, or any
-- trigger of an older version) is replaced by the lease "<name> <due_ms> triggered": its first
-- send. If that lease already exists, the occurrence is in flight and its lease carries it:
-- the pending member is dropped and not re-leased.
-- A pending buffered slot "<name> <due_ms> buffered" (report.lua) becomes the plain lease
-- "<name> <due_ms>", its first send.
-- Returns {{claimed candidate index (1-based), ...}, {re-leased member as given, ...},
--          earliest registry score or '', earliest lease deadline or '',
--          {candidate index, member in flight it replaces, ...}, {skipped index, ...},
--          {buffered index, ...}} after the writes: a re-leased "... manual" or
-- "... buffered" member is a first send, any other a redelivery.
-- Add `by` to a counter. A counter edited by hand into a non-integer restarts at `by`
-- instead of failing the script halfway (a script error keeps the writes made before it).
local function count(record, field, by)
  local result = redis.pcall('HINCRBY', record, field, by)
  if type(result) == 'table' and result.err then redis.call('HSET', record, field, by) end
end

-- The integer ms that scan reported for a score (registry.py `_due_ms`): a score edited by
-- hand to a fraction is floored and -inf is 0, so that member is claimed, not stuck due.
local function due_ms(score)
  local value = tonumber(score)
  if value == -math.huge then return 0 end
  return math.floor(value)
end

-- ZADD many score/member pairs at once, in chunks (Lua's unpack has a stack limit): one
-- call per chunk instead of one per member is most of what a claim costs the server.
local function zadd_all(key, pairs)
  for i = 1, #pairs, 1000 do
    redis.call('ZADD', key, unpack(pairs, i, math.min(i + 999, #pairs)))
  end
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
local claimed, replaced, skipped, buffered = {}, {}, {}, {}
local moves, leases, moved = {}, {}, {}

-- The member of the occurrence of `record` in flight, if its lost deadline has not passed.
local function in_flight(record)
  local member = redis.call('HGET', record, 'inflight')
  if not member then return nil end
  local live = redis.call('ZSCORE', running, member)
  if live and tonumber(live) > server_now then return member end
  return nil
end

for i, candidate in ipairs(candidates) do
  local name, expected, next_score, missed, mode, history, id = unpack(candidate)
  local score = redis.call('ZSCORE', KEYS[1], name)
  -- `moved`: the score moves only at the end, so a name given twice is claimed once.
  if score and due_ms(score) == tonumber(expected) and not moved[name] then
    moved[name] = true
    moves[#moves + 1] = next_score
    moves[#moves + 1] = name
    local record = KEYS[2 + i]
    local member = name .. ' ' .. expected
    if mode ~= 'fire' and mode ~= 'defer' then  -- a guarded registration
      local busy = in_flight(record)
      if busy and (mode == 'skip' or redis.call('HEXISTS', record, 'buffered') == 1) then
        mode = 'skipped'
        count(record, 'skipped', 1)
        local entry = {id, expected, now, '', '', 'skipped', 1, 0, 0, ''}
        redis.call('LPUSH', KEYS[tonumber(history)], cjson.encode(entry))
        redis.call('LTRIM', KEYS[tonumber(history)], 0, cap - 1)
        local newest = tonumber(redis.call('HGET', record, 'history_due'))
        if not newest or tonumber(expected) > newest then  -- report.lua's search bound
          redis.call('HSET', record, 'history_due', expected)
        end
        skipped[#skipped + 1] = i
      elseif busy and mode == 'buffer_one' then
        mode = 'buffered'
        redis.call('HSET', record, 'buffered', expected)
        buffered[#buffered + 1] = i
      else
        if busy then  -- 'replace'
          replaced[#replaced + 1] = i
          replaced[#replaced + 1] = busy
        end
        redis.call('HSET', record, 'inflight', member)
        redis.call('ZADD', running, start_deadline, member)
        mode = 'fire'
      end
    end
    if mode == 'fire' then
      leases[#leases + 1] = deadline
      leases[#leases + 1] = member
      redis.call('HSET', record, 'last_due_ms', expected)
      if tonumber(missed) > 0 then count(record, 'missed', missed) end
      claimed[#claimed + 1] = i
    end
  end
end
local PENDING, TRIGGERED, BUFFERED = ' manual', ' triggered', ' buffered'
local released, held, served = {}, {}, {}
for _, member in ipairs(expired) do
  local lease = redis.call('ZSCORE', KEYS[2], member)
  if lease and tonumber(lease) <= tonumber(now) then
    local target = member
    if string.sub(member, -#PENDING) == PENDING then
      target = string.sub(member, 1, -#PENDING - 1) .. TRIGGERED
    elseif string.sub(member, -#BUFFERED) == BUFFERED then
      target = string.sub(member, 1, -#BUFFERED - 1)
    end
    if target ~= member then
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
for i = 1, #served, 1000 do
  redis.call('ZREM', KEYS[2], unpack(served, i, math.min(i + 999, #served)))
end
zadd_all(KEYS[1], moves)
zadd_all(KEYS[2], leases)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local first_lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {claimed, released, first[2] or '', first_lease[2] or '', replaced, skipped, buffered}
