"""A schedule whose queue the Celery app cannot send to (`task_create_missing_queues=False`
and a queue `task_queues` lacks) is parked, not retried for ever (probe: Celery transport
options, session 31).

Celery refuses such a send with `QueueNotFound`, and no retry can change that while the
app's configuration stands. It was a transient `DispatchError`: a lease kept for every slot
(36, 66, 96 after 30, 60, 90 s of a 1 s schedule), `list` saying `active`, and after a fix
every held slot sent at once. Now it is a `PermanentDispatchError`, parked as a refused
argument is, on the default and the pipelined path; `resume` brings it back.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from kombu import Queue

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery("mq", broker=redis_url, set_as_current=False)
    app.conf.update(
        result_backend=None,
        task_create_missing_queues=False,
        task_queues=[Queue(f"{prefix}-known")],
        task_default_queue=f"{prefix}-known",
    )

    @app.task(name="mq.tick", shared=False)
    def tick() -> None:
        return None

    yield app
    app.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_queue_the_app_lacks_parks_its_schedule_and_its_neighbour_is_sent(
    app: Celery, repeat: Repeat, client: redis.Redis, prefix: str, pipelined: bool
) -> None:
    known, missing = f"{prefix}-known", f"{prefix}-other"
    hour_ago = repeat.server_time_ms() - 3_600_000
    template = {"task": "mq.tick", "args": [], "kwargs": {}, "options": {}}
    repeat.register(known, "fine", every="1h", template=template, now_ms=hour_ago)
    repeat.register(missing, "stray", every="1h", template=template, now_ms=hour_ago)
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    try:
        tick = Pump(repeat, [known, missing], dispatcher).run_once()
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()
    assert [o.name for o in tick.dispatched] == ["fine"]
    assert tick.parked == ["stray"]
    stray = repeat.get(missing, "stray")
    assert stray is not None and stray.parked_reason is not None
    assert "missing from task_queues" in stray.parked_reason, stray.parked_reason
    assert repeat.leases(missing) == []  # dropped once, not held for a retry per lease
    assert client.llen(known) == 1 and client.llen(missing) == 0
