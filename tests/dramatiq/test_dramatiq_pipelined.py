"""The opt-in pipelined Dramatiq path: what it writes, a real worker consumes as usual."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, Middleware

from emq_bridge import ConfigError, Pump, Repeat, occurrence_id
from emq_bridge.dramatiq import PipelinedDramatiqDispatcher, current_occurrence

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000


class CountingMiddleware(Middleware):
    """Counts the enqueue hooks, to prove the fast path runs the broker's middleware."""

    def __init__(self) -> None:
        self.before = 0
        self.after = 0

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        self.before += 1

    def after_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        self.after += 1


def test_a_pipelined_batch_is_consumed_once_each_by_a_real_worker_with_its_occurrence_id(
    redis_url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dramatiq")
    counting = CountingMiddleware()
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(counting)
    seen_key = f"{prefix}:seen"

    def record(n: int) -> None:
        message = CurrentMessage.get_current_message()
        info = current_occurrence()
        assert message is not None and info is not None
        client.rpush(seen_key, json.dumps({"id": message.message_id, "name": info.name, "n": n}))

    dramatiq.actor(record, broker=broker, actor_name="record", queue_name=queue)
    repeat = Repeat(client, prefix)
    for i in range(300):
        repeat.register(
            queue, f"job-{i}", every="1h", template={"task": "record", "args": [i]}, now_ms=T0
        )
    repeat.register(queue, "stray", every="1h", template={"task": "no.such.actor"}, now_ms=T0)

    tick = Pump(repeat, [queue], PipelinedDramatiqDispatcher(broker), batch_size=128).run_once(
        now_ms=T0 + HOUR
    )
    assert len(tick.dispatched) == 300
    assert [o.name for o in tick.failed] == ["stray"]  # a bad item fails alone
    assert (counting.before, counting.after) == (300, 300)

    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while client.llen(seen_key) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # room for a duplicate to show up, if there were one
    finally:
        worker.stop(timeout=10_000)
        broker.close()
    seen = [json.loads(raw) for raw in client.lrange(seen_key, 0, -1)]
    assert len(seen) == 300
    assert sorted(s["n"] for s in seen) == list(range(300))
    for entry in seen:
        assert entry["id"] == occurrence_id(prefix, queue, entry["name"], T0 + HOUR)


def test_the_pipelined_path_refuses_a_broker_that_is_not_redis() -> None:
    with pytest.raises(ConfigError, match="needs a RedisBroker"):
        PipelinedDramatiqDispatcher(StubBroker())
