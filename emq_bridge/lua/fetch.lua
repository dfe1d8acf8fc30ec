-- fetch: the given fields of several records in one call, without writing.
--
-- KEYS     <prefix>:{q}:repeat:<name> records
-- ARGV     field names
--
-- Returns one JSON text: an array with, per record, the array of its field values (false
-- where a field is missing). A record key that is not a hash (edited by hand) gives an
-- empty array, so one broken record never fails the load of the others. One JSON text,
-- not nested arrays, because a client parses it in one C call instead of one per value.
-- A template stored in pieces (template_pieces.py) comes back whole in its `template` slot,
-- with `template_pieces` false, when both fields are asked for.
local template_at, pieces_at
for j, field in ipairs(ARGV) do
  if field == 'template' then template_at = j elseif field == 'template_pieces' then pieces_at = j end
end
-- A template's second piece is read with the fields (one HMGET, not an HGET more): most
-- templates in pieces have two (a piece is 64 bytes). Its slot is dropped before encoding.
local fields, second = ARGV, nil
if template_at and pieces_at then
  fields = {unpack(ARGV)}
  second = #fields + 1
  fields[second] = 'template.2'
end
local out = {}
for i, key in ipairs(KEYS) do
  local values = redis.pcall('HMGET', key, unpack(fields))
  if type(values) == 'table' and values.err then values = {} end
  local count = second and tonumber(values[pieces_at])
  if count and values[template_at] then
    local parts = {values[template_at]}
    if count > 32 then  -- past MAX_PIECES (edited by hand, even 'inf'): corrupt, not a loop
      parts[2] = '\0'
      count = 1
    end
    for n = 2, count do
      parts[n] = (n == 2 and values[second]) or redis.call('HGET', key, 'template.' .. n) or '\0'
    end
    values[template_at] = table.concat(parts)
    values[pieces_at] = false
  end
  if second then values[second] = nil end
  out[i] = values
end
if #out == 0 then return '[]' end  -- cjson would write an empty table as {}
return cjson.encode(out)
