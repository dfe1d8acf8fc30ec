-- claim: compare-and-set claim of due registrations, and re-lease of expired leases.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:leases          sorted set: "<name> <due_ms>" -> lease deadline
-- KEYS[3 .. 2+n]  <prefix>:{q}:repeat:<name> records, one per candidate
-- ARGV[1]  now, epoch ms
-- ARGV[2]  lease deadline, epoch ms
-- ARGV[3]  n: number of candidates
-- ARGV[4 .. 3+5n]  per candidate: name, score read by scan, next score, missed, mode
--                  mode 'fire': move the score, lease the occurrence, count it
--                  mode 'defer': only move the score (a corrupt record is parked)
-- ARGV[4+5n ..]    expired lease members to re-lease
--
-- A candidate is claimed only if its score is still the one scan read, so two pumps never
-- claim the same occurrence; its score moves to the next run in the same step.
-- Returns {{claimed candidate index (1-based), ...}, {re-leased member, ...},
--          earliest registry score or '', earliest lease deadline or ''} after the writes.
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

local now = ARGV[1]
local deadline = ARGV[2]
local n = tonumber(ARGV[3])
local claimed = {}
for i = 1, n do
  local base = 4 + (i - 1) * 5
  local name, expected, next_score, missed, mode =
    ARGV[base], ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4]
  local score = redis.call('ZSCORE', KEYS[1], name)
  if score and due_ms(score) == tonumber(expected) then
    redis.call('ZADD', KEYS[1], next_score, name)
    if mode == 'fire' then
      local record = KEYS[2 + i]
      redis.call('ZADD', KEYS[2], deadline, name .. ' ' .. expected)
      redis.call('HSET', record, 'last_due_ms', expected, 'last_fired_ms', now)
      count(record, 'fired', 1)
      if tonumber(missed) > 0 then count(record, 'missed', missed) end
      claimed[#claimed + 1] = i
    end
  end
end
local released = {}
for j = 4 + n * 5, #ARGV do
  local member = ARGV[j]
  local lease = redis.call('ZSCORE', KEYS[2], member)
  if lease and tonumber(lease) <= tonumber(now) then
    redis.call('ZADD', KEYS[2], deadline, member)
    released[#released + 1] = member
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local first_lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {claimed, released, first[2] or '', first_lease[2] or ''}
