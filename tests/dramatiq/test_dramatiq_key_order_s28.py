"""Session 28: an actor's recurring `args` and `kwargs` reach the actor with their dicts in
the order the user wrote them, through the registry and either dispatcher, as Dramatiq's own
`actor.send` encodes them.

Earlier releases stored the template with its keys sorted at every depth, so the message
held them sorted. Here the message each path writes to the Redis broker is read back, and a
real worker runs the actor and records the order it received.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Pump, Repeat
from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    PipelinedDramatiqDispatcher,
    broker_declarations,
    recurring,
)
from emq_bridge.sync import sync

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
HOUR = 3_600_000
ARGS = [{"name": "Name", "email": "E-mail", "age": "Age"}, [{"z": 1, "a": 2}]]
KWARGS = {"steps": {"zeta": 1, "alpha": 2, "mid": {"y": [{"q": 0, "b": 1}], "b": None}}, "b": 1}


def messages(client: redis.Redis, namespace: str, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in `queue` (Dramatiq's Redis broker keeps each in a hash),
    decoded with their key order; the queue emptied."""
    found = [json.loads(raw) for raw in client.hvals(f"{namespace}:{queue}.msgs")]
    client.delete(f"{namespace}:{queue}.msgs", f"{namespace}:{queue}")
    return found


def order(message: dict[str, Any]) -> str:
    return json.dumps([message["args"], message["kwargs"]])


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_recurring_actors_dicts_reach_the_broker_and_the_actor_in_their_order(
    redis_url: str, prefix: str, pipelined: bool
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    namespace = f"{prefix}-dramatiq"
    broker = RedisBroker(url=redis_url, namespace=namespace)
    seen_key = f"{prefix}:seen"

    def report(columns: dict[str, Any], rows: list[Any], steps: Any = None, b: Any = None) -> None:
        client.rpush(
            seen_key,
            json.dumps({"columns": list(columns), "row": list(rows[0]), "steps": list(steps)}),
        )

    actor = recurring(every="1h", args=ARGS, kwargs=KWARGS)(
        dramatiq.actor(report, broker=broker, actor_name="k28.report", queue_name=queue)
    )
    # What Dramatiq itself sends for the same call.
    actor.send(*json.loads(json.dumps(ARGS)), **json.loads(json.dumps(KWARGS)))
    [own] = messages(client, namespace, queue)
    assert list(own["args"][0]) == ["name", "email", "age"]
    assert list(own["kwargs"]["steps"]) == ["zeta", "alpha", "mid"]

    repeat = Repeat(client, prefix, clock=lambda: T0)
    sync(repeat, broker_declarations(broker), "s28")
    dispatcher = PipelinedDramatiqDispatcher(broker) if pipelined else DramatiqDispatcher(broker)
    tick = Pump(repeat, [queue], dispatcher).run_once(now_ms=T0 + HOUR)
    assert [o.name for o in tick.dispatched] == ["k28.report"]
    [ours] = messages(client, namespace, queue)
    assert order(ours) == order(own)

    # Sent again and run by a real worker: the actor gets the order too.
    Pump(repeat, [queue], dispatcher).run_once(now_ms=T0 + 2 * HOUR)
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while client.llen(seen_key) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop(timeout=10_000)
        broker.close()
    [seen] = [json.loads(raw) for raw in client.lrange(seen_key, 0, -1)]
    assert seen == {
        "columns": ["name", "email", "age"],
        "row": ["z", "a"],
        "steps": ["zeta", "alpha", "mid"],
    }
