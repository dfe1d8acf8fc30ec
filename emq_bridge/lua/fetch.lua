-- fetch: the given fields of several records in one call, without writing.
--
-- KEYS     <prefix>:{q}:repeat:<name> records
-- ARGV     field names
--
-- Returns one JSON text: an array with, per record, the array of its field values (false
-- where a field is missing). A record key that is not a hash (edited by hand) gives an
-- empty array, so one broken record never fails the load of the others. One JSON text,
-- not nested arrays, because a client parses it in one C call instead of one per value.
local out = {}
for i, key in ipairs(KEYS) do
  local values = redis.pcall('HMGET', key, unpack(ARGV))
  if type(values) == 'table' and values.err then values = {} end
  out[i] = values
end
if #out == 0 then return '[]' end  -- cjson would write an empty table as {}
return cjson.encode(out)
