-- heartbeat: write (or remove) one pump's heartbeat in a queue's pump table, and drop the
-- heartbeats that expired.
--
-- KEYS[1]  <prefix>:{q}:pumps   hash: pump id -> "<expires_ms> <beat_ms> <json>"
-- ARGV[1]  the pump's id
-- ARGV[2]  the pump's JSON object (id, host, pid, queues, version, ...), or "" to remove it
--          (a pump that stops)
-- ARGV[3]  how long the heartbeat lives, ms
--
-- Times are this server's clock (TIME), as every due decision is, so readers on hosts with
-- other clocks agree on who is alive. The key has no expiry of its own (PERSIST drops one an
-- earlier release set): under a `volatile-*` maxmemory policy a key with a TTL is what the
-- server evicts first, and the queue's live pumps would vanish from `health`. A queue whose
-- last pump died keeps its expired field until another pump of it writes (readers skip it).
-- Returns the server's now, ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, id, info, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
if info ~= '' then
  redis.call('HSET', key, id, string.format('%d %d %s', now + ttl, now, info))
end
-- A stopping pump's field is removed with the expired ones, after the table is read:
-- cluster slot migration: while the queue's slot is MIGRATING, a command on a key this
-- script emptied fails ("non local key": the server takes it for a key moved away), so the
-- HGETALL must not follow a delete of the last field. Each field is deleted once, and the
-- key is touched no more once it is empty (PERSIST only while a field is kept).
local latest = 0
local entries = redis.call('HGETALL', key)
for i = 1, #entries, 2 do
  local expires = tonumber(string.match(entries[i + 1], '^(%d+) '))
  if (info == '' and entries[i] == id) or expires == nil or expires <= now then
    redis.call('HDEL', key, entries[i])
  elseif expires > latest then
    latest = expires
  end
end
if latest > now then
  redis.call('PERSIST', key)
end
return now
