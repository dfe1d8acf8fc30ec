-- lost: mark the occurrences whose lost deadline passed as `lost`: their worker stopped
-- heartbeating (killed, its host gone) or, for a guarded registration, no worker reported
-- their start in time.
--
-- KEYS[1]  <prefix>:{q}:leases          sorted set: lease member -> deadline (buffered slots)
-- KEYS[2]  <prefix>:{q}:running         sorted set: occurrence in flight -> lost deadline
-- KEYS[1 + 2i], KEYS[2 + 2i]  the record and the history list of member i
-- ARGV[1]  unused (was the pump's now: deadlines are on this server's clock, TIME)
-- ARGV[2]  the history's length cap
-- ARGV[3]  the lost deadline, from now, of a buffered slot released to be sent, ms
-- ARGV[4]  wake channel
-- ARGV[5]  JSON array of [member, occurrence id, due_ms], as scan read them
--
-- A member is marked only if it is still in `running` and its deadline passed, so two pumps
-- never mark one twice. Its history entry becomes `lost` (created if the worker never
-- reported), the record counts `lost` and says `last_status` lost unless a later occurrence
-- was reported since or a backfill sent it (out of band, as in report.lua);
-- if it was the registration's `inflight` occurrence, a `buffered` slot is released
-- (report.lua). A later report (a final one, or the start of a redelivery) still replaces
-- `lost` (report.lua's ranks).
-- Returns the 1-based indexes of the members marked.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap, start_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local leases, running = KEYS[1], KEYS[2]

-- #include running

-- Redis refuses a script's writes for lack of memory only until its first write: a write
-- that may grow memory goes first (a no-op: XX never adds), so a server out of memory
-- refuses this move whole (OOM). It must: the workers' heartbeats and reports are refused
-- meanwhile, so no deadline passed here says a worker stopped.
redis.call('ZADD', running, 'XX', 0, '')

local marked = {}
for i, item in ipairs(cjson.decode(ARGV[5])) do
  local member, id, due = unpack(item)
  local record, history = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local deadline = running_score(member)
  if deadline and tonumber(deadline) <= now then
    leave_running(member)
    marked[#marked + 1] = i
    if redis.call('EXISTS', record) == 1 then
      local name = string.match(member, '^(%S+)')
      local prefix = '["' .. id .. '"'
      local found, backfilled = false, false
      -- The attempt a worker began (begin.lua's `inflight_run`), when its start report never
      -- came (it waits aside `linger_s`, or Redis refused it): the attempt that is lost, so
      -- that a copy of it skipped or revoked later is a copy of the lost attempt, not a
      -- later one (report.lua's `hides_loss`).
      -- (One read of the record's in-flight fields: nothing below writes them before their
      -- use: `inflight` and `inflight_also` decide the promotion after the history.)
      local state = redis.call('HMGET', record, 'inflight', 'inflight_also', 'inflight_run')
      local began = 0
      if state[1] == member and state[3] then
        local run_id, run_attempt = string.match(state[3], '^(%S+) (%d+)$')
        if run_id == id then began = tonumber(run_attempt) end
      end
      for index, raw in ipairs(redis.call('LRANGE', history, 0, -1)) do
        if string.sub(raw, 1, #prefix) == prefix then
          local entry = cjson.decode(raw)
          if entry[6] == 'running' or entry[6] == 'retrying' then
            entry[6] = 'lost'
            if began > (tonumber(entry[7]) or 1) then
              -- That attempt's start, end and error are not known: not the earlier one's.
              entry[4], entry[5], entry[7], entry[10] = '', '', began, ''
            end
            redis.call('LSET', history, index - 1, cjson.encode(entry))
          end
          found, backfilled = true, entry[11] == 1
          break
        end
      end
      if not found then
        local triggered = 0
        if string.sub(member, -10) == ' triggered' then triggered = 1 end
        local attempt = math.max(began, 1)
        redis.call('LPUSH', history,
                   cjson.encode({id, due, '', '', '', 'lost', attempt, 0, triggered, ''}))
        redis.call('LTRIM', history, 0, cap - 1)
        -- report.lua searches the history only for occurrences not after `history_due`.
        local newest = tonumber(redis.call('HGET', record, 'history_due'))
        if not newest or tonumber(due) > newest then
          redis.call('HSET', record, 'history_due', due)
        end
      end
      local result = redis.pcall('HINCRBY', record, 'lost', 1)
      if type(result) == 'table' and result.err then redis.call('HSET', record, 'lost', 1) end
      -- A backfilled run is out of band (report.lua): counted, but not the live last run.
      local last = tonumber(redis.call('HGET', record, 'last_due'))
      if not backfilled and (not last or tonumber(due) >= last) then
        redis.call('HSET', record, 'last_status', 'lost', 'last_id', id, 'last_due', due)
      end
      -- The occurrences in flight beside it (report.lua's `inflight_also`): it leaves them,
      -- and when it was the `inflight` one, the first of them still live takes its place.
      local promoted = nil
      if state[2] then
        local kept = {}
        for other in string.gmatch(state[2], '[^\n]+') do
          local live = running_score(other)
          if other ~= member and live and tonumber(live) > now then
            if state[1] == member and not promoted then
              promoted = other
            else
              kept[#kept + 1] = other
            end
          end
        end
        if #kept > 0 then
          redis.call('HSET', record, 'inflight_also', table.concat(kept, '\n'))
        else
          redis.call('HDEL', record, 'inflight_also')
        end
      end
      if state[1] == member and promoted then
        redis.call('HSET', record, 'inflight', promoted)
      elseif state[1] == member then
        redis.call('HDEL', record, 'inflight')
        local slot = redis.call('HGET', record, 'buffered')
        if slot and redis.call('HGET', record, 'paused') == '1' then
          -- Paused: the slot that waited is not sent (report.lua's release does the same).
          redis.call('HDEL', record, 'buffered')
          local counted = redis.pcall('HINCRBY', record, 'missed', 1)
          if type(counted) == 'table' and counted.err then redis.call('HSET', record, 'missed', 1) end
        elseif slot then
          local next_member = name .. ' ' .. slot
          redis.call('HDEL', record, 'buffered')
          local previous = redis.call('HGET', record, 'last_due_ms') or ''
          if tonumber(previous) and tonumber(previous) >= tonumber(slot) then
            -- Later slots fired meanwhile (the policy was edited to allow): `last_due_ms`
            -- never moves back (the guards against firing a slot again read it), and the
            -- slot fired before this one is not known.
            redis.call('HSET', record, 'inflight', next_member, 'buffered_previous_ms', '')
          else
            redis.call('HSET', record, 'inflight', next_member, 'last_due_ms', slot,
                       'buffered_previous_ms', previous)
          end
          enter_running(now + start_ttl, next_member)
          redis.call('ZADD', leases, 'NX', 0, next_member .. ' buffered')
          redis.pcall('PUBLISH', ARGV[4], name)
        end
      end
    end
  end
end
running_done()
return marked
