-- register: EchoMQ's idempotent register, guarded by EXISTS.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run (epoch ms)
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- ARGV[1]  name
-- ARGV[2]  first run, epoch ms
-- ARGV[3]  wake channel (published to when a record is written)
-- ARGV[4..] record field, value pairs (every_ms, template, ...)
--
-- Returns 1 when registered, 0 when the record exists (nothing written).
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
