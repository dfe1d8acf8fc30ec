-- begin: a worker asks, before it runs an occurrence of a guarded registration (overlap
-- other than allow), whether it may: not while another occurrence of it is in flight.
--
-- KEYS[1]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[2]  <prefix>:{q}:running         sorted set: occurrence in flight -> lost deadline
-- ARGV[1]  the occurrence's lease member, "<name> <due_ms>"
-- ARGV[2]  how long it is in flight from now without a heartbeat, ms
-- ARGV[3]  '1': only ask (a Celery worker's main process, on receipt): nothing is written
-- KEYS[3]  <prefix>:{q}:history:<name>  list: the registration's history (report.lua)
-- ARGV[4]  the occurrence's id
-- ARGV[5]  its attempt (1 for a first run)
-- ARGV[6]  its nominal time, epoch ms
--
-- The claim already keeps a slot from being sent while one is in flight; this closes what
-- the claim cannot see: a message the broker delivers again after the pump marked it lost (a
-- killed worker's, requeued later), or a retry that waited in the queue past its hold. Such an
-- occurrence, started while another one runs, is refused, and the worker skips it. One that
-- may run becomes the registration's `inflight` one, live in `running` (server clock).
-- A copy of an occurrence whose attempt already ended (its history entry says succeeded,
-- failed, revoked or skipped at that attempt or a later one) is refused too: a message the broker
-- delivered twice (a send that outlasted its lease, an ack lost with its worker) whose first
-- copy ran. Marking it in flight would hold the registration with no report to end it (the
-- copy's reports outrank nothing), until the pump marked it lost. So is a copy of an attempt
-- that runs now, started and still heartbeated (a Celery Redis transport redelivers an
-- unacked message once its visibility timeout passes, while the first copy still runs): the
-- two would overlap, which a guarded registration is to prevent. (A worker that died is
-- heard of no more: once its heartbeats lapse, the copy may start, and so it will when the
-- broker delivers it after that.)
-- Returns 1 run it, 0 another occurrence is in flight (skip it, reported skipped), -1 no such
-- registration, -2 a copy of this attempt that ran (drop it: report nothing), -3 a copy of
-- this attempt that runs now (drop it, or deliver it again once the first copy's heartbeats
-- would have lapsed: it runs then if they did).
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
-- The `inflight` occurrence, those in flight beside it (`inflight_also`, report.lua), and
-- the newest nominal time the history holds.
local cur = redis.call('HMGET', KEYS[1], 'inflight', 'inflight_also', 'history_due',
                       'inflight_run', 'replaced_runs', 'overlap')
-- The history holds no entry of an occurrence later than its newest (`history_due`): a first
-- copy, the usual case, is not searched for; a copy is nearly always among the newest.
local function entry_of(id)
  local prefix = '["' .. id .. '"'
  for _, range in ipairs({{0, 7}, {8, -1}}) do
    for _, raw in ipairs(redis.call('LRANGE', KEYS[3], range[1], range[2])) do
      if string.sub(raw, 1, #prefix) == prefix then return cjson.decode(raw) end
    end
  end
  return nil
end
-- An attempt that failed and waits for its retry (`retrying`) ended too: its retry comes as
-- the next attempt, so a message of that attempt or an earlier one is a copy. So did one a
-- worker skipped (the overlap check, an `Ignore`, an age limit): a copy delivered again is
-- skipped for good, not run with reports that `skipped` outranks (it would be held in
-- flight until marked lost).
local ENDED = {succeeded = true, failed = true, revoked = true, retrying = true, skipped = true}
local newest = tonumber(cur[3])
local entry = newest and tonumber(ARGV[6]) <= newest and entry_of(ARGV[4])
if entry and ENDED[entry[6]] and tonumber(entry[7]) >= tonumber(ARGV[5]) then return -2 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- This attempt runs now: its history entry says so, or, before its start report landed (the
-- reporter sends it within its linger), the mark of the worker that started it (below): a
-- copy of a run whose process died at once is held as one whose process died later.
local run = ARGV[4] .. ' ' .. ARGV[5]
local started = entry and entry[6] == 'running' and tonumber(entry[7]) == tonumber(ARGV[5])
if started or (cur[1] == ARGV[1] and cur[4] == run) then
  local live = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if live and tonumber(live) > now then return -3 end
end
local others = {cur[1] or nil}  -- (a missing field reads as false)
for member in string.gmatch(cur[2] or '', '[^\n]+') do others[#others + 1] = member end
-- Runs a `replace` took over (claim.lua's `replaced_runs`) are being stopped: not in the way
-- of a slot of that policy. One edited since to `skip` or `buffer_one` waits for those still
-- in flight (a framework that cannot revoke, Dramatiq's, runs them on).
local replaced = {}
for member in string.gmatch(cur[5] or '', '[^\n]+') do
  if cur[6] == 'replace' then replaced[member] = true else others[#others + 1] = member end
end
for _, other in ipairs(others) do
  if other ~= ARGV[1] and not replaced[other] then
    local live = redis.call('ZSCORE', KEYS[2], other)
    if live and tonumber(live) > now then return 0 end
  end
end
if ARGV[3] == '1' then return 1 end
-- `inflight_run`: which run of the occurrence a worker started (the claim marks the slot
-- in flight before any worker has it), for the copy check above.
redis.call('HSET', KEYS[1], 'inflight', ARGV[1], 'inflight_run', run)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
