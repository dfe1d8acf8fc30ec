-- dramatiq_enqueue: enqueue a batch of Dramatiq messages in one call, writing for each what
-- the `enqueue` command of Dramatiq 2.x's own `dispatch` script (dramatiq/brokers/redis/
-- dispatch.lua) writes. Not a registry move: PipelinedDramatiqDispatcher
-- (emq_bridge/dramatiq/dispatch.py) sends it on the broker's client.
--
-- KEYS[1]  the broker's namespace (RedisBroker.namespace); the keys are built from it as
--          dispatch.lua builds them (the script takes the namespace as its only key too):
--          <namespace>:<queue>       list of redis message ids, consumed from the left
--          <namespace>:<queue>.msgs  hash: redis message id -> encoded message
--          <namespace>:__heartbeats__  sorted set: broker id -> timestamp of its last call
-- ARGV[1]  the timestamp, epoch ms on the sender's clock (dispatch.lua's ARGV[2])
-- ARGV[2]  the sending broker's id (RedisBroker.broker_id, dispatch.lua's ARGV[4])
-- ARGV[3 ..]  one group per queue: the queue name, n, then n pairs (redis message id,
--          encoded message), in the order they are to be consumed
--
-- Per message, as dispatch.lua's enqueue: HSET <queue>.msgs id message, RPUSH <queue> id;
-- and, as every dispatch.lua call, ZADD __heartbeats__ timestamp broker id (once here: the
-- calls of a batch would write the same member with the same timestamp). dispatch.lua's
-- maintenance (requeueing the messages of dead workers, expiring dead letters) is left out:
-- every worker runs it with the same chance on each fetch, and enqueueing needs none of it.
--
-- Returns one entry per group, in order: 0 when its messages are written, else the error
-- text of the write that failed (a queue key of another type: that group's messages only).

local namespace = KEYS[1]
redis.call('ZADD', namespace .. ':__heartbeats__', ARGV[1], ARGV[2])

-- Pairs per HSET/RPUSH: `unpack` is bounded by the Lua stack (LUAI_MAXCSTACK, 8000).
local CHUNK = 200

local function write(queue_key, first, last)
  for from = first, last, 2 * CHUNK do
    local to = math.min(from + 2 * CHUNK - 1, last)
    local written = redis.pcall('HSET', queue_key .. '.msgs', unpack(ARGV, from, to))
    if type(written) == 'table' and written.err then return written.err end
    local ids = {}
    for i = from, to, 2 do ids[#ids + 1] = ARGV[i] end
    local pushed = redis.pcall('RPUSH', queue_key, unpack(ids))
    if type(pushed) == 'table' and pushed.err then return pushed.err end
  end
  return 0
end

local results = {}
local at = 3
while at <= #ARGV do
  local n = tonumber(ARGV[at + 1])
  local first = at + 2
  local last = first + 2 * n - 1
  results[#results + 1] = write(namespace .. ':' .. ARGV[at], first, last)
  at = last + 1
end
return results
