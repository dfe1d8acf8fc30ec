-- resume: put a paused registration back in the registry at its next run, if its record is
-- still as the caller read it.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- ARGV[1]  name
-- ARGV[2]  next run, epoch ms (computed by the caller from the fields below: cron math is
--          Python's)
-- ARGV[3]  wake channel
-- ARGV[4]  the record's `paused_next_ms` as the caller read it ('' when it had none)
-- ARGV[5]  its `cadence_digest` as read ('' when none)
-- ARGV[6]  its `last_due_ms` as read ('' when none): the last fired slot
-- ARGV[7]  now, epoch ms (`completed_ms` if the resume completes it)
-- ARGV[8]  slots to add to `missed` (those that passed before the pause, with no pump to
--          send them, which a resume without catch-up drops; '' or 0 for none)
-- ARGV[9]  '', 'dispatch' or 'dispatch <source> <generation>': resume it only if a pump
--          parked it for a dispatch that could not work (`parked_dispatch`, park.lua: the
--          parking pump's code, '-' for none), not one of that code, and nothing else
--          paused it (no `paused_ms`: no pause by hand, which park.lua keeps; a failure
--          streak's pause has no mark): else write nothing and return 0. A sync of code that
--          declares it resumes so (its generation: the same code cannot send it either).
-- ARGV[10..] record fields and values written when it resumes (an importer's cut-over: the
--          replaced scheduler's run count and last run; may be absent)
--
-- The next run was derived from ARGV[4..6]. If one of them changed since the read (another
-- writer resumed, a pump fired a slot, the registration was paused again or given another
-- cadence), writing it could re-arm a slot already fired: nothing is written, and the caller
-- reads again. A next run at or before the last fired slot is refused the same way, so a
-- resume never moves a score back to a fired slot.
-- A completed registration (bounds.py) resumes as completed (score +inf); a next run past the
-- record's last instant (`end_ms`, the last of `at`) completes it, as claim.lua does.
-- Returns 1 resumed, 0 not paused, -1 no such registration, -2 conflict (nothing written).
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local cur = redis.call(
  'HMGET', KEYS[2], 'paused', 'paused_next_ms', 'cadence_digest', 'last_due_ms',
  'parked_dispatch', 'paused_ms'
)
if cur[1] ~= '1' then return 0 end
if ARGV[9] ~= '' then
  if not cur[5] or cur[6] then return 0 end
  if ARGV[9] == 'dispatch ' .. cur[5] then return 0 end
end
for i = 2, 4 do
  if (cur[i] or '') ~= ARGV[i + 2] then return -2 end
end
local last = tonumber(cur[4])
if last and tonumber(ARGV[2]) <= last then return -2 end
local dropped = tonumber(ARGV[8])
if dropped and dropped > 0 then
  -- A counter edited by hand into a non-integer restarts (claim.lua's `count`).
  local counted = redis.pcall('HINCRBY', KEYS[2], 'missed', dropped)
  if type(counted) == 'table' and counted.err then redis.call('HSET', KEYS[2], 'missed', dropped) end
end
if #ARGV > 9 then redis.call('HSET', KEYS[2], unpack(ARGV, 10)) end
local score = ARGV[2]
local f = redis.call('HMGET', KEYS[2], 'end_ms', 'at', 'remaining', 'limit', 'completed')
local last_at = f[2] and tonumber(string.match(f[2], '(%d+)$'))
local reason = nil
if f[4] and tonumber(f[3]) and tonumber(f[3]) <= 0 then
  reason = 'limit'
elseif last_at and tonumber(score) > last_at then
  reason = 'at'
elseif tonumber(f[1]) and tonumber(score) > tonumber(f[1]) then
  reason = 'end_at'
end
if f[5] then
  score = '+inf'
elseif reason then
  score = '+inf'
  redis.call('HSET', KEYS[2], 'completed', reason, 'completed_ms', ARGV[7] or '')
end
-- `parked_reason`/`parked_ms`/`parked_dispatch`: a registration park.lua (or report.lua,
-- after failures) stopped is resumed the same way; resuming clears the failure streak; `paused_note`,
-- `paused_by`, `paused_ms`: pause.lua's note. Deleted last, but a field ARGV[10..] wrote (kept
-- as when the delete came first): cluster slot migration: while the queue's slot is
-- MIGRATING, a command on a key this script emptied fails ("non local key": the server
-- takes it for a key moved away) with the writes before it kept, so the record is not
-- touched after a delete that could empty it.
local cleared, written = {}, {}
for i = 10, #ARGV - 1, 2 do written[ARGV[i]] = true end
for _, field in ipairs({'paused', 'paused_next_ms', 'parked_reason', 'parked_ms',
                        'parked_dispatch', 'failures', 'paused_note', 'paused_by',
                        'paused_ms'}) do
  if not written[field] then cleared[#cleared + 1] = field end
end
if #cleared > 0 then redis.call('HDEL', KEYS[2], unpack(cleared)) end
redis.call('ZADD', KEYS[1], score, ARGV[1])
redis.pcall('PUBLISH', ARGV[3], ARGV[1])
return 1
