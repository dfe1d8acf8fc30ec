-- stamp: note that a sync of a source left this queue as its declarations say.
--
-- KEYS[1]  <prefix>:{q}:synced  hash: `{w}<source>` -> the writes counted for that source
--          (upsert.lua, register.lua and cancel.lua add one per record of it they write or
--          remove); `<source>` -> `"<fingerprint> <counter>"`, its stamp
-- ARGV[1]  source
-- ARGV[2]  fingerprint of the declarations the sync applied
-- ARGV[3]  the counter the sync expects: the one it read before its plan plus its own writes
--
-- A counter that moved otherwise means another writer changed the source's records here
-- since the plan was read: the stamp is dropped, not written, so a boot whose fingerprint
-- matches trusts it only while nothing but that sync wrote (sync.py, `stamped`). Source
-- names hold no braces, so a counter's field is never a stamp's. A counter that was never
-- started (`Repeat.begin_stamp`) refuses too: writers count only where it exists.
-- Returns 1 stamped (or already stamped so), 0 refused.
local counter = redis.call('HGET', KEYS[1], '{w}' .. ARGV[1])
if counter ~= ARGV[3] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 0
end
local stamp = ARGV[2] .. ' ' .. counter
if redis.call('HGET', KEYS[1], ARGV[1]) ~= stamp then redis.call('HSET', KEYS[1], ARGV[1], stamp) end
return 1
