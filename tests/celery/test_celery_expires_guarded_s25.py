"""A guarded Celery task whose message expires unseen does not hold its schedule for the
start timeout (found by a probe on RabbitMQ).

Celery turns a task's `expires` into the AMQP `expiration` of its message, so RabbitMQ
drops it while no worker takes it (workers down, or busy for longer than `expires`), and no
worker reports it. With `overlap="skip"` the occurrence stayed in flight for the start
timeout, 10 minutes, and every slot meanwhile was skipped. Now the pump bounds its wait for
a start by its expiry (`CeleryDispatcher.expiry_ms`, plus `EXPIRY_MARGIN_MS`): then it is
lost, and the schedule goes on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery
from kombu import Connection

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.celery.expiry import expires_in_ms
from emq_bridge.lifecycle import START_TIMEOUT_MS
from emq_bridge.pump import EXPIRY_MARGIN_MS

pytestmark = pytest.mark.timeout(90)

EXPIRES_S = 1


@pytest.fixture
def queue(rabbitmq_url: str) -> Iterator[str]:
    name = f"expires-{uuid.uuid4().hex[:8]}"
    yield name
    with Connection(rabbitmq_url) as connection:
        connection.default_channel.queue_delete(name)


def test_an_expired_message_no_worker_saw_frees_its_guarded_schedule(
    rabbitmq_url: str, redis_url: str, prefix: str, queue: str
) -> None:
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register(
        queue,
        "tick",
        every="1s",
        overlap="skip",
        template={"task": "proj.tick", "options": {"expires": EXPIRES_S}},
    )
    app = Celery("expires", broker=rabbitmq_url)
    app.conf.update(result_backend=None, task_default_queue=queue)
    with Connection(rabbitmq_url) as connection:  # the queue exists, no worker consumes it
        connection.default_channel.queue_declare(queue, durable=True, auto_delete=False)
    pump = Pump(repeat, [queue], CeleryDispatcher(app))
    try:
        first = []
        deadline = time.monotonic() + 10
        while not first and time.monotonic() < deadline:
            first = pump.run_once().dispatched
            time.sleep(0.05)
        assert len(first) == 1
        running = repeat.client.zscore(repeat.keys(queue).running, first[0].lease_member)
        sent_at = repeat.server_time_ms()
        assert running is not None
        bound = EXPIRES_S * 1000 + EXPIRY_MARGIN_MS
        assert running <= sent_at + bound and running < sent_at + START_TIMEOUT_MS
        # Its slots are skipped while it may still start; once past the bound it is lost,
        # and the next slot is sent: seconds, not the start timeout's ten minutes.
        again = []
        deadline = time.monotonic() + bound / 1000 + 10
        while not again and time.monotonic() < deadline:
            again = pump.run_once().dispatched
            time.sleep(0.1)
        assert len(again) == 1 and again[0].id != first[0].id

        def first_status() -> str | None:
            statuses = {e.id: e.status for e in repeat.history(queue, "tick")}
            return statuses.get(first[0].id)

        # Its deadline may pass between a tick's scan and its claim: the claim then sends the
        # next slot, and the next tick's scan marks the first lost.
        deadline = time.monotonic() + 5
        while first_status() is None and time.monotonic() < deadline:
            pump.run_once()
            time.sleep(0.1)
        assert first_status() == "lost"
        registration = repeat.get(queue, "tick")
        assert registration is not None and registration.skipped >= 1
    finally:
        app.close()


def test_expires_is_read_as_celery_reads_it() -> None:
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert expires_in_ms({"options": {"expires": 2.5}}, now) == 2500
    later = (now + timedelta(seconds=30)).isoformat()
    assert expires_in_ms({"options": {"expires": later}}, now) == 30_000
    assert expires_in_ms({"options": {"expires": "2030-01-01T00:01:00"}}, now) == 60_000
    for template in ({}, {"options": {}}, {"options": {"expires": True}}, {"options": "x"}):
        assert expires_in_ms(template, now) is None
    assert expires_in_ms({"options": {"expires": "soon"}}, now) is None
