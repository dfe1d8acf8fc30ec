-- slots (included by claim.lua and backfill.lua): the signature of the fields that place a
-- registration's slots, which backfill.lua stores as `backfill_cadence` with the slots it
-- queues and claim.lua compares before it sends one of them.
local SLOT_FIELDS = {'cron', 'tz', 'day_and', 'seed', 'every_ms', 'anchor', 'offset_ms', 'exclude'}
-- `values[from ..]` are the SLOT_FIELDS' values, in that order. The values themselves, each
-- after its length (no digest: fakeredis, which emq_bridge.testing runs these scripts on,
-- has no redis.sha1hex); a record's few short fields.
local function slot_signature(values, from)
  local parts = {}
  -- `seed` places slots only in a cron's H terms (hashed.py `uses_hash`); jitter's is not.
  local hashed = string.find(' ' .. (values[from] or ''), '[%s,][Hh]')
  for i = 1, #SLOT_FIELDS do
    local value = values[from + i - 1] or ''
    if SLOT_FIELDS[i] == 'seed' and not hashed then value = '' end
    parts[i] = #value .. ':' .. value
  end
  return table.concat(parts, ' ')
end
