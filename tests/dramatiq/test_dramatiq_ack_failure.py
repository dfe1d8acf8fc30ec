"""A Dramatiq worker whose ack to the broker fails after the actor returned.

Dramatiq then logs "Unhandled error during post_process_message" and calls neither
`after_ack` nor `after_nack`, so no final report comes. The run must not stay in flight for
as long as the worker lives (its heartbeats went on, and a `skip` schedule stayed blocked):
it is heartbeated no more once the actor returned, so a pump marks it lost and the schedule
goes on. A real worker (in this process) on a real Redis broker; only the ack is made to
fail, the way a Redis timeout makes it fail.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer

from emq_bridge import Repeat
from emq_bridge.dramatiq import RecurringMiddleware, recurring

HEARTBEAT_S = 0.5
MAX_SLEEP_S = 0.5


class _FirstAckFails(_RedisConsumer):  # type: ignore[misc]
    failed = threading.Event()

    def ack(self, message: Any) -> None:
        if not self.failed.is_set():
            self.failed.set()
            raise redis.exceptions.TimeoutError("Timeout reading from socket")
        super().ack(message)


class _Broker(RedisBroker):  # type: ignore[misc]
    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _FirstAckFails


@pytest.fixture
def worker_app(redis_url: str, prefix: str, client: redis.Redis) -> Iterator[tuple[str, Repeat]]:
    queue = f"q{uuid.uuid4().hex[:8]}"
    broker = _Broker(url=redis_url, namespace=f"d{uuid.uuid4().hex[:8]}")
    repeat = Repeat(client, prefix)
    broker.add_middleware(
        RecurringMiddleware(repeat, heartbeat_s=HEARTBEAT_S, max_sleep_s=MAX_SLEEP_S)
    )
    actor = dramatiq.actor(lambda: None, broker=broker, actor_name="job", queue_name=queue)
    recurring(every="1s", overlap="skip")(actor)
    _FirstAckFails.failed.clear()
    worker = dramatiq.Worker(broker, worker_threads=1)
    worker.start()
    try:
        yield queue, repeat
    finally:
        worker.stop(timeout=10_000)
        broker.close()


def test_a_run_whose_ack_failed_is_lost_and_its_skip_schedule_goes_on(
    worker_app: tuple[str, Repeat],
) -> None:
    queue, repeat = worker_app
    assert _FirstAckFails.failed.wait(15), "no message was acked"
    deadline = time.monotonic() + 3 * HEARTBEAT_S + MAX_SLEEP_S + 8
    history = repeat.history(queue, "job")
    while time.monotonic() < deadline:
        history = repeat.history(queue, "job")
        if any(e.status == "lost" for e in history) and any(
            e.status == "succeeded" for e in history
        ):
            break
        time.sleep(0.1)
    statuses = [e.status for e in reversed(history)]  # oldest first
    # The run whose ack failed: lost (not running for ever); the next slots run again.
    assert statuses[0] == "lost", statuses
    assert "succeeded" in statuses, statuses
