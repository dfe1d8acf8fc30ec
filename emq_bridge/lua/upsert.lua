-- upsert: register, or rewrite the record when the definition digest differs.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run (epoch ms)
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- ARGV[1]  name
-- ARGV[2]  definition digest
-- ARGV[3]  cadence digest
-- ARGV[4]  first run under this cadence, epoch ms
-- ARGV[5]  wake channel
-- ARGV[6]  now, epoch ms (created_ms of a new record)
-- ARGV[7]  n: number of field, value pairs that follow
-- ARGV[8 .. 7+2n]   record field, value pairs (definition, digests, source, updated_ms)
-- ARGV[8+2n ..]     definition fields the new definition leaves out (deleted)
--
-- Returns 0 unchanged (nothing written), 1 created, 2 updated.
-- An update keeps the score unless the cadence changed; a paused record stays paused
-- (score +inf). A record whose registry member went missing gets it back (repair).
local n = tonumber(ARGV[7])
local pairs_end = 7 + 2 * n
local exists = redis.call('EXISTS', KEYS[2]) == 1
if exists then
  local cur = redis.call('HMGET', KEYS[2], 'digest', 'cadence_digest', 'paused')
  local paused = cur[3] == '1'
  if cur[1] == ARGV[2] then
    -- Unchanged. Only repair a record whose registry member went missing.
    if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
    if paused then
      redis.call('ZADD', KEYS[1], '+inf', ARGV[1])
    else
      redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
    end
    redis.call('PUBLISH', ARGV[5], ARGV[1])
    return 2
  end
  if #ARGV > pairs_end then
    redis.call('HDEL', KEYS[2], unpack(ARGV, pairs_end + 1))
  end
  redis.call('HSET', KEYS[2], unpack(ARGV, 8, pairs_end))
  if paused then
    if cur[2] ~= ARGV[3] then redis.call('HSET', KEYS[2], 'paused_next_ms', ARGV[4]) end
    redis.call('ZADD', KEYS[1], '+inf', ARGV[1])
  elseif cur[2] ~= ARGV[3] or not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
  end
  redis.call('PUBLISH', ARGV[5], ARGV[1])
  return 2
end
redis.call('HSET', KEYS[2], 'created_ms', ARGV[6], unpack(ARGV, 8, pairs_end))
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[1])
return 1
