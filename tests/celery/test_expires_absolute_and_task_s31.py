"""A Celery task's absolute `expires`, and the task's own `expires` default, count from the
claim on the Redis server's clock too (left open by session 30's fix of relative `expires`).

Celery makes the AMQP `expiration` of an absolute `expires` (an ISO 8601 instant) the time
left by the sending host's clock (`Celery.send_task`): a pump 90 s ahead of the server gave
RabbitMQ a TTL 90 s short, and the broker dropped tasks before their time. And a task
declared `@app.task(expires=60)` takes that default in `Task.apply_async`, which the
dispatcher did not see, so it was dated by the host's clock as before session 30. Now both
count from the claim's server time (`Occurrence.released_ms`); a template's own `expires`,
None included, still wins over the task's, as in Celery.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection

from emq_bridge import Occurrence
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z, the claim's server time: far from this host's
RELEASED_MS = T0 + 123


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("s31exp-test", broker=redis_url)
    app.conf.update(result_backend=None)

    @app.task(name="s31exp.plain", shared=False)
    def plain() -> None:
        return None

    @app.task(name="s31exp.expiring", expires=2.5, shared=False)
    def expiring() -> None:
        return None

    yield app
    app.close()


def occurrence(queue: str, task: str, options: dict[str, Any]) -> Occurrence:
    template = {"task": task, "options": options}
    return Occurrence(queue, "tick", T0, str(uuid.uuid4()), template, released_ms=RELEASED_MS)


def sent(client: redis.Redis, queue: str) -> dict[str, Any]:
    [raw] = client.lrange(queue, 0, -1)
    client.delete(queue)
    message: dict[str, Any] = json.loads(raw)
    return message


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_an_absolute_expires_keeps_its_instant_and_its_ttl_counts_from_the_claim(
    app: Celery, client: redis.Redis, pipelined: bool
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    absolute = occurrence(queue, "s31exp.plain", {"expires": "2030-03-17T00:01:00+00:00"})
    try:
        assert dispatcher.dispatch_batch([absolute]) == [None]
        message = sent(client, queue)
        assert message["headers"]["expires"] == "2030-03-17T00:01:00+00:00"  # as given
        # 60 s after T0, the claim 0.123 s after T0: not the years from this host's now.
        assert message["properties"]["expiration"] == "59877"
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_the_tasks_own_expires_counts_from_the_claim(
    app: Celery, client: redis.Redis, pipelined: bool
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    try:
        assert dispatcher.dispatch_batch([occurrence(queue, "s31exp.expiring", {})]) == [None]
        message = sent(client, queue)
        assert message["headers"]["expires"] == "2030-03-17T00:00:02.623000+00:00"
        assert message["properties"]["expiration"] == "2500"
        # The pump's start-timeout bound sees it too.
        assert dispatcher.expiry_ms({"task": "s31exp.expiring", "options": {}}) == 2500
        # The template's own `expires` wins, None included, as in `Task.apply_async`.
        overriding = occurrence(queue, "s31exp.expiring", {"expires": 10})
        assert dispatcher.dispatch_batch([overriding]) == [None]
        assert sent(client, queue)["headers"]["expires"] == "2030-03-17T00:00:10.123000+00:00"
        assert dispatcher.dispatch_batch(
            [occurrence(queue, "s31exp.expiring", {"expires": None})]
        ) == [None]
        assert sent(client, queue)["headers"]["expires"] is None
        assert (
            dispatcher.expiry_ms({"task": "s31exp.expiring", "options": {"expires": None}}) is None
        )
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()


def test_rabbitmq_gets_the_ttl_left_at_the_claim(rabbitmq_url: str) -> None:
    queue = f"s31exp-{uuid.uuid4().hex[:8]}"
    app = Celery("s31exp-rabbit", broker=rabbitmq_url)
    app.conf.update(result_backend=None, task_default_queue=queue)
    try:
        with Connection(rabbitmq_url) as connection:
            channel = connection.default_channel
            channel.queue_declare(queue, durable=True, auto_delete=False)
            try:
                at = "2030-03-17T00:01:00+00:00"
                CeleryDispatcher(app).dispatch(occurrence(queue, "s31exp.plain", {"expires": at}))
                message = None
                deadline = time.monotonic() + 10
                while message is None and time.monotonic() < deadline:
                    message = channel.basic_get(queue, no_ack=True)
                    if message is None:
                        time.sleep(0.05)
            finally:
                channel.queue_delete(queue)
        assert message is not None
        assert message.headers["expires"] == "2030-03-17T00:01:00+00:00"
        assert message.properties["expiration"] == "59877"
    finally:
        app.close()
