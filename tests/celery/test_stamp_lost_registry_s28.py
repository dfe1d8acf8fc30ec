"""A beat restart after an eviction took the queue's registry sorted set (its `synced` hash
of stamps kept), which a memory-pressure probe found firing nothing ever again.

Before: the boot found its stamp holding ("unchanged since its last sync ... no record
read") over a registry with no member, so no schedule fired. Now the stamp holds only while
each queue of the app's schedules has at least as many registry members as its sync left
there: the boot syncs in full, which puts every member back at its next run (one WARNING
line), stamps again, and the restart after that is the unchanged one (nothing read).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge.celery import RepeatScheduler
from emq_bridge.testing import ManualClock

UNCHANGED = "unchanged since its last sync"
RESTORED = "schedule(s) restored"


def record(*args: Any, **kwargs: Any) -> None:
    return None


ENTRIES = {f"tick{i}": {"task": "t.record", "schedule": 5, "args": [i]} for i in range(4)}


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Callable[[], Celery]]:
    apps: list[Celery] = []

    def build() -> Celery:
        app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule=ENTRIES,
            result_backend=None,
            result_expires=None,
        )
        app.task(name="t.record", shared=False)(record)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def boot(app: Celery, caplog: pytest.LogCaptureFixture) -> tuple[RepeatScheduler, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        scheduler = RepeatScheduler(app)
    return scheduler, [r.getMessage() for r in caplog.records]


def test_a_restart_after_the_registry_was_evicted_syncs_in_full_and_fires_again(
    make_app: Callable[[], Celery],
    client: redis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"{prefix}-q"
    first, said = boot(make_app(), caplog)
    assert not any(UNCHANGED in line for line in said)
    repeat = first.pump.repeat  # type: ignore[union-attr]
    names = sorted(repeat.names(queue))
    assert len(names) == len(ENTRIES)
    first.close()
    client.delete(repeat.keys(queue).registry)  # what allkeys-* eviction did; stamps kept

    second, said = boot(make_app(), caplog)

    assert not any(UNCHANGED in line for line in said), said
    assert sum(RESTORED in line for line in said) == 1
    assert sorted(repeat.names(queue)) == names
    # It fires again: each entry is due within its 5 s interval.
    clock = ManualClock(repeat.server_time_ms())
    second.pump.clock = clock  # type: ignore[union-attr]
    clock.advance(5000)
    second.tick()
    assert client.llen(queue) == len(ENTRIES)
    second.close()

    third, said = boot(make_app(), caplog)  # stamped again by the full sync
    assert any(UNCHANGED in line for line in said)
    third.close()
