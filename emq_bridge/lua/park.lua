-- park: stop firing a registration whose occurrences can never be sent (a permanent dispatch
-- failure: an unknown task or actor, a template the framework refuses), say why, and drop
-- the leases of its failed occurrences.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[3]  <prefix>:{q}:leases          sorted set: lease member -> lease deadline (keys.py)
-- KEYS[4]  <prefix>:{q}:generations     hash: source -> its highest synced generation
-- ARGV[1]  name
-- ARGV[2]  the lease deadline the pump wrote, epoch ms (the fence of the leases)
-- ARGV[3]  the record's `template` field as the pump read it, when the failure was seen
-- ARGV[4]  the reason, one line
-- ARGV[5]  now, epoch ms
-- ARGV[6]  wake channel
-- ARGV[7]  the source of the code the pump runs ('' for none)
-- ARGV[8]  that code's generation ('' for none)
-- ARGV[9]  when that code's declarations were synced, epoch ms ('' for unknown)
-- ARGV[10..] lease members of the failed occurrences
--
-- Parked is paused (score +inf, the next run kept in `paused_next_ms`, so `resume` puts it
-- back) plus `parked_reason`, `parked_ms` and `parked_dispatch`, which `resume` clears. The
-- leases still at ARGV[2] are dropped: nothing of the registration is retried. A record whose template
-- changed since the read is not parked and keeps its leases (the new template is tried when
-- they expire). A registration paused by hand is parked too, keeping its next run.
-- A pump running an older generation of its source than the queue holds is an old worker of
-- a rolling deploy: what it cannot send, the new code may (an actor the new version added),
-- so nothing is parked and the leases stay, for whichever pump re-takes them on expiry.
-- Without generations, a record its own source rewrote after the pump's code was synced
-- (`updated_ms` later than ARGV[9]) is newer code's as well: the same.
-- The failures are the registration's only while their leases are: when none of those given
-- is held at ARGV[2] any more, it was cancelled since (cancel.lua drops them), and a record
-- there now is another registration under its name (a cancel and re-add, as an app editing
-- a schedule does), never tried: it is not parked (-1, nothing written). Leases another
-- pump re-took after they expired are that pump's to send, and to park.
-- Returns 1 parked now, 0 parked already (only the leases dropped), -1 no such registration
-- (or none of its failed leases held), -2 the template changed (nothing written), -3 newer
-- code is live (nothing written).
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
-- Every deadline is read before the first ZREM, and each member is dropped once: cluster
-- slot migration: while the queue's slot is MIGRATING, a command on a key this script
-- emptied fails ("non local key": the server takes it for a key moved away) with the writes
-- before it kept, and a read after the drop of the last lease would leave the leases
-- dropped and the registration not parked. Removing distinct members it holds, the key
-- can only empty at the last ZREM.
local drop, seen = {}, {}
for i = 10, #ARGV do
  local deadline = redis.call('ZSCORE', KEYS[3], ARGV[i])
  if deadline and tonumber(deadline) == tonumber(ARGV[2]) and not seen[ARGV[i]] then
    seen[ARGV[i]] = true
    drop[#drop + 1] = ARGV[i]
  end
end
if #ARGV >= 10 and #drop == 0 then return -1 end  -- (none given: a park by hand)
if ARGV[8] ~= '' then
  local live = tonumber(redis.call('HGET', KEYS[4], ARGV[7]))
  if live and live > tonumber(ARGV[8]) then return -3 end
end
local cur = redis.call('HMGET', KEYS[2], 'template', 'paused', 'parked_reason', 'template_pieces',
                       'source', 'updated_ms')
if ARGV[9] ~= '' and ARGV[7] ~= '' and cur[5] == ARGV[7]
   and (tonumber(cur[6]) or 0) > tonumber(ARGV[9]) then
  return -3
end
if cur[4] and cur[1] then  -- a template stored in pieces (template_pieces.py): compare it whole
  local parts = {cur[1]}
  -- At most MAX_PIECES (32): a count edited by hand (even 'inf') is no loop.
  for n = 2, math.min(tonumber(cur[4]) or 1, 32) do
    parts[n] = redis.call('HGET', KEYS[2], 'template.' .. n) or ''
  end
  cur[1] = table.concat(parts)
end
if cur[1] ~= ARGV[3] then return -2 end
for _, member in ipairs(drop) do redis.call('ZREM', KEYS[3], member) end
if cur[3] then return 0 end
if cur[2] ~= '1' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'paused', '1', 'paused_next_ms', score or '')
  redis.call('ZADD', KEYS[1], '+inf', ARGV[1])
end
-- `parked_dispatch`: parked here, for what a pump could not send, with that pump's code
-- ("<source> <generation>", '-' for none), so that a sync of other code that declares it may
-- resume it (resume.lua's 'dispatch'), unlike a pause by hand or a failure streak's.
local parked_by = ARGV[8] ~= '' and (ARGV[7] .. ' ' .. ARGV[8]) or '-'
redis.call('HSET', KEYS[2], 'parked_reason', ARGV[4], 'parked_ms', ARGV[5],
           'parked_dispatch', parked_by)
redis.pcall('PUBLISH', ARGV[6], ARGV[1])
return 1
