-- running: the `running` sorted set (occurrence in flight -> lost deadline) of a script
-- that may empty it, included by `-- #include running` after `running` (its key) is set.
--
-- Cluster slot migration: while the queue's slot is MIGRATING, a command on a key this
-- script emptied fails ("non local key": the server takes it for a key moved away) and the
-- writes made before it stay: a final report or a lost mark that left `running` empty would
-- fail the release of a buffered slot (lost) and every later item of the call. So the last
-- member of `running` is not removed at once: it is held out (read as gone) until a member
-- is added, or the script ends (`running_done()`, its last command on the key).
local running_size, held_out = nil, nil  -- its size, read at the first removal
local function running_score(member)
  if member == held_out then return nil end
  return redis.call('ZSCORE', running, member)
end
local function leave_running(member)
  if member == held_out then return end
  running_size = running_size or redis.call('ZCARD', running)
  if running_size == 1 and redis.call('ZSCORE', running, member) then
    held_out = member
    return
  end
  running_size = running_size - redis.call('ZREM', running, member)
end
local function enter_running(deadline, member)
  local added = redis.call('ZADD', running, deadline, member)
  if running_size then running_size = running_size + added end
  if held_out and held_out ~= member then
    running_size = running_size - redis.call('ZREM', running, held_out)
  end
  held_out = nil
end
local function running_done()
  if held_out then redis.call('ZREM', running, held_out) end  -- nothing touches it after
end
