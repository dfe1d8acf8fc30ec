"""On RabbitMQ, a publish the broker holds up mid-batch re-sends at most itself.

kombu cannot batch RabbitMQ publishes, so `CeleryDispatcher.dispatch_batch` published a
claimed batch one task after another, out of the pump's sight: a publish held past the lease
(a memory alarm blocks publishers) let the leases of the whole batch expire, and another beat
sent again the tasks published before it and those after it. The dispatcher now says it
cannot publish a batch at once (`batch_at_once`), so the pump sends the batch one task at a
time, keeping its leases between the sends and acking what was sent while one blocks.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish
from kombu import Connection
from quiet import quiet_offset

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = pytest.mark.timeout(60)

HOUR = 3_600_000


@pytest.fixture
def queue(rabbitmq_url: str) -> Iterator[str]:
    name = f"slowpub-{uuid.uuid4().hex[:8]}"
    yield name
    with Connection(rabbitmq_url) as connection:
        connection.default_channel.queue_delete(name)


def _sent(url: str, queue: str) -> list[str]:
    """The registration name of each task in `queue` (consumed)."""
    names = []
    with Connection(url) as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            names.append(message.headers["emq_schedule"].rsplit("/", 1)[-1])
    return names


def test_a_publish_held_past_the_lease_mid_batch_re_sends_at_most_itself(
    rabbitmq_url: str, redis_url: str, prefix: str, queue: str
) -> None:
    setup = Repeat(redis.Redis.from_url(redis_url), prefix)
    now = setup.server_time_ms()
    offset = quiet_offset()  # a top of the hour mid-test would make each job due again
    for i in range(5):
        setup.register(
            queue, f"job-{i}", every="1h", offset=offset, template={"task": "t"}, now_ms=now - HOUR
        )
    app = Celery("slowpub", broker=rabbitmq_url, set_as_current=False)
    app.conf.update(result_backend=None, task_default_queue=queue)
    dispatcher = CeleryDispatcher(app)
    assert dispatcher.batch_at_once is False  # RabbitMQ: kombu publishes one at a time

    a_thread: list[threading.Thread] = []

    def held(headers: dict[str, Any] | None = None, **_: Any) -> None:
        # Pump A's publish of job-2 is held 1.2 s, three times its lease.
        if threading.current_thread() in a_thread and str(
            (headers or {}).get("emq_schedule")
        ).endswith("/job-2"):
            time.sleep(1.2)

    before_task_publish.connect(held, weak=False)
    try:
        a = Pump(setup, [queue], dispatcher, lease_ms=400)
        b = Pump(Repeat(redis.Redis.from_url(redis_url), prefix), [queue], dispatcher, lease_ms=400)
        done = threading.Event()
        thread = threading.Thread(target=lambda: (a.run_once(), done.set()))
        a_thread.append(thread)
        thread.start()
        time.sleep(0.05)  # A claims first
        while not done.is_set():
            b.run_once()
            time.sleep(0.03)
        thread.join(10)
        b.run_once()
    finally:
        before_task_publish.disconnect(held)
    sent = Counter(_sent(rabbitmq_url, queue))
    assert setup.leases(queue) == []
    # job-2 may go out twice (B re-took its lease while its publish was held), no other.
    assert {name: n for name, n in sent.items() if name != "job-2"} == {
        f"job-{i}": 1 for i in (0, 1, 3, 4)
    }
    assert 1 <= sent["job-2"] <= 2
