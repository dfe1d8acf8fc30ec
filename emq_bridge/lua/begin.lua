-- begin: a worker asks, before it runs an occurrence of a guarded registration (overlap
-- other than allow), whether it may: not while another occurrence of it is in flight.
--
-- KEYS[1]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- KEYS[2]  <prefix>:{q}:running         sorted set: occurrence in flight -> lost deadline
-- ARGV[1]  the occurrence's lease member, "<name> <due_ms>"
-- ARGV[2]  how long it is in flight from now without a heartbeat, ms
-- ARGV[3]  '1': only ask (a Celery worker's main process, on receipt): nothing is written
--
-- The claim already keeps a slot from being sent while one is in flight; this closes what
-- the claim cannot see: a message the broker delivers again after the pump marked it lost (a
-- killed worker's, requeued later), or a retry that waited in the queue past its hold. Such an
-- occurrence, started while another one runs, is refused, and the worker skips it. One that
-- may run becomes the registration's `inflight` one, live in `running` (server clock).
-- Returns 1 run it, 0 another occurrence is in flight (skip it), -1 no such registration.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The `inflight` occurrence, and those in flight beside it (`inflight_also`, report.lua).
local cur = redis.call('HMGET', KEYS[1], 'inflight', 'inflight_also')
local others = {cur[1] or nil}  -- (a missing field reads as false)
for member in string.gmatch(cur[2] or '', '[^\n]+') do others[#others + 1] = member end
for _, other in ipairs(others) do
  if other ~= ARGV[1] then
    local live = redis.call('ZSCORE', KEYS[2], other)
    if live and tonumber(live) > now then return 0 end
  end
end
if ARGV[3] == '1' then return 1 end
redis.call('HSET', KEYS[1], 'inflight', ARGV[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
