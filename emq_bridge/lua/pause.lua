-- pause: park a registration at score +inf, keeping its next run in the record.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- ARGV[1]  name
-- ARGV[2]  wake channel
--
-- The member stays in the sorted set (one member per registration, always); +inf is never
-- due. Returns 1 paused, 0 already paused, -1 no such registration.
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'paused') == '1' then return 0 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'paused', '1', 'paused_next_ms', score or '')
redis.call('ZADD', KEYS[1], '+inf', ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
