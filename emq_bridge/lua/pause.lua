-- pause: park a registration at score +inf, keeping its next run in the record.
--
-- KEYS[1]  <prefix>:{q}:repeat          sorted set: name -> next run
-- KEYS[2]  <prefix>:{q}:repeat:<name>   hash: the registration record
-- ARGV[1]  name
-- ARGV[2]  wake channel
-- ARGV[3]  note ('' for none): why, shown by `show`
-- ARGV[4]  by ('' for none): who
-- ARGV[5]  now, epoch ms (`paused_ms`)
--
-- The member stays in the sorted set (one member per registration, always); +inf is never
-- due. Returns 1 paused, 0 already paused, -1 no such registration.
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'paused') == '1' then return 0 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'paused', '1', 'paused_next_ms', score or '', 'paused_ms', ARGV[5])
-- A note and author are set only when given; nothing stale is left from an earlier pause
-- (resume.lua deletes them), so an absent field means none was given.
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'paused_note', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], 'paused_by', ARGV[4]) end
redis.call('ZADD', KEYS[1], '+inf', ARGV[1])
redis.pcall('PUBLISH', ARGV[2], ARGV[1])
return 1
