"""What would stop a Dramatiq worker's pump stops its boot instead, or is left out (probe:
Dramatiq broker options, session 31).

Dramatiq logs and drops an exception raised in `after_worker_boot`, where the pump thread is
started: `RecurringMiddleware(pipelined=True)` on a broker that is not a `RedisBroker`, and a
queue over the registry's 200 bytes on any actor (Dramatiq takes one), left a worker running
with no pump at all, nothing sent, behind one CRITICAL line. Now the dispatcher is built in
`before_worker_boot` (a `BootError`: the worker does not start, as docs/dramatiq.md says of
`pipelined=True`), and a queue the registry cannot name is not pumped (no schedule can be on
it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import BootError, RecurringMiddleware
from emq_bridge.dramatiq.schedule import recurring


@pytest.fixture
def workers() -> Iterator[list[dramatiq.Worker]]:
    started: list[dramatiq.Worker] = []
    yield started
    for worker in started:
        worker.stop()


def test_pipelined_true_on_a_rabbitmq_broker_stops_the_boot(
    rabbitmq_url: str, redis_url: str, prefix: str
) -> None:
    broker = RabbitmqBroker(url=rabbitmq_url)
    broker.add_middleware(RecurringMiddleware(repeat=redis_url, prefix=prefix, pipelined=True))
    queue = f"{prefix}-q"
    recurring(every="1s")(
        dramatiq.actor(lambda: None, broker=broker, actor_name="tick", queue_name=queue)
    )
    worker = dramatiq.Worker(broker, worker_threads=1)
    try:
        with pytest.raises(BootError, match="needs a RedisBroker"):
            worker.start()
        assert not worker.workers
    finally:
        broker.close()


def test_an_actor_on_a_queue_the_registry_cannot_name_leaves_the_pump_running(
    redis_url: str, client: redis.Redis, prefix: str, workers: list[dramatiq.Worker]
) -> None:
    broker = RedisBroker(url=redis_url, namespace=f"ns{uuid.uuid4().hex[:10]}")
    middleware = RecurringMiddleware(repeat=redis_url, prefix=prefix, max_sleep_s=0.2)
    broker.add_middleware(middleware)
    queue = f"{prefix}-q"
    ran: list[Any] = []
    recurring(every="1s")(
        dramatiq.actor(lambda: ran.append(1), broker=broker, actor_name="tick", queue_name=queue)
    )
    dramatiq.actor(lambda: None, broker=broker, actor_name="long", queue_name="q" * 201)
    worker = dramatiq.Worker(broker, worker_threads=1)
    worker.start()
    workers.append(worker)
    deadline = time.monotonic() + 15
    while not ran and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ran, "the schedule on the valid queue never ran"
    assert middleware.pump is not None and "q" * 201 not in middleware.pump.queues
    record = Repeat(client, prefix).get(queue, "tick")
    assert record is not None and record.fired >= 1
