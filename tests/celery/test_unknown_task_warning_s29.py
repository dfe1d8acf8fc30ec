"""A beat that sends another app's schedule by name says so, once (probe: several apps).

Two Celery apps A and B share one registry (one prefix), each with its own source and its
own `beat_schedule` in the same default queue. A pump serves queues, not sources, so B's
beat sends A's schedule too: by name (`send_task`), to B's broker, as `celery beat` sends a
task its app lacks. It did so without a word. Now it logs one WARNING per queue and task,
naming the schedule and the fix (a prefix per app); B's own task, which it knows, logs
nothing. Both dispatchers (the default and the pipelined path) are run, in process, against
the test server, with a manual clock: two slots of each schedule, one warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge import Occurrence, occurrence_id
from emq_bridge.celery import CeleryDispatcher, RepeatScheduler
from emq_bridge.errors import PermanentDispatchError
from emq_bridge.testing import ManualClock

DISPATCH_LOGGER = "emq_bridge.celery.dispatch"


def ping() -> None:
    return None


@pytest.fixture
def apps(redis_url: str, prefix: str, client: redis.Redis) -> Iterator[dict[str, Celery]]:
    """Apps A and B, both on queue `<prefix>-q` (their default) of one registry."""
    built = {}
    for label in ("a", "b"):
        app = Celery(f"app{label}-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            timezone="UTC",
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule={f"{label}_only": {"task": f"app{label}.ping", "schedule": 1.0}},
            result_backend=None,
            result_expires=None,
        )
        app.task(name=f"app{label}.ping", shared=False)(ping)
        built[label] = app
    yield built
    for app in built.values():
        app.close()
    client.delete(f"{prefix}-q")  # the broker's list of the queue (not under the prefix)


def sent_tasks(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["task"] for raw in reversed(client.lrange(queue, 0, -1))]


@pytest.mark.parametrize("pipelined", [False, True], ids=["apply_async", "pipelined"])
def test_a_beat_sending_another_apps_task_by_name_warns_once_per_queue_and_task(
    apps: dict[str, Celery],
    client: redis.Redis,
    prefix: str,
    pipelined: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"{prefix}-q"
    RepeatScheduler(apps["a"]).close()  # A's deploy: its schedule synced under its source
    apps["b"].conf.emq_bridge_pipelined = pipelined
    beat = RepeatScheduler(apps["b"])
    assert beat.pump is not None
    repeat = beat.pump.repeat
    owners = {r.name: r.source for r in repeat.iter_list(queue)}
    assert owners == {"a_only": f"celery.appa-{prefix}", "b_only": f"celery.appb-{prefix}"}
    clock = ManualClock(repeat.server_time_ms())
    beat.pump.clock = clock
    caplog.set_level(logging.WARNING, logger=DISPATCH_LOGGER)
    for _ in range(2):  # two slots of each schedule, each in a tick of its own
        clock.advance(1000)
        beat.tick()
    beat.close()

    # What is sent is unchanged: A's task by name to B's broker, beside B's own.
    sent = sent_tasks(client, queue)
    assert sent.count("appa.ping") == 2 and sent.count("appb.ping") == 2, sent
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == DISPATCH_LOGGER and r.levelno == logging.WARNING
    ]
    assert warnings == [
        f"{queue}/a_only: task 'appa.ping' is not registered in the Celery app "
        f"'appb-{prefix}'; sent by name to this app's broker. If another app shares this "
        "registry (same emq_bridge_prefix), give each app its own emq_bridge_prefix"
    ]
    assert not any("appb.ping" in line for line in caplog.messages)


def test_a_known_task_only_dispatcher_still_refuses_and_warns_of_nothing(
    apps: dict[str, Celery], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"{prefix}-q"
    template: dict[str, Any] = {"task": "appa.ping", "args": [], "kwargs": {}, "options": {}}
    occurrence = Occurrence(
        queue=queue,
        name="a_only",
        due_ms=0,
        id=occurrence_id(prefix, queue, "a_only", 0),
        template=template,
        released_ms=0,
    )
    caplog.set_level(logging.WARNING, logger=DISPATCH_LOGGER)
    with pytest.raises(PermanentDispatchError, match="is not a task of the Celery app"):
        CeleryDispatcher(apps["b"], known_tasks_only=True).dispatch(occurrence)
    assert [r for r in caplog.records if r.name == DISPATCH_LOGGER] == []
