-- resume: put a paused registration back in the registry at its next run.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- ARGV[1]  name
-- ARGV[2]  next run, epoch ms (computed by the caller from the record's cadence)
-- ARGV[3]  wake channel
--
-- Returns 1 resumed, 0 not paused, -1 no such registration.
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'paused') ~= '1' then return 0 end
redis.call('HDEL', KEYS[2], 'paused', 'paused_next_ms')
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
