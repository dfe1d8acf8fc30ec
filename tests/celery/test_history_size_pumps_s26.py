"""The pumps an app runs keep its `emq_bridge_history_size`, not the default 50 (found by a
probe, session 26).

A pump writes history entries of its own (the slots a guarded schedule skips, the runs it
marks lost) and trims the history to its `history_size` as it does. Celery's beat and
`emq-bridge pump --celery/--dramatiq` built their pump with the default, so every skipped
slot cut a history the workers kept at 1,000 back to 50. Real servers: the registry and the
broker are the test Redis; the beat's pump is driven in process on a manual clock.
"""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from emq_bridge.celery import RepeatScheduler
from emq_bridge.celery import load_target as celery_target
from emq_bridge.errors import ConfigError
from emq_bridge.outcome import HISTORY_SIZE
from emq_bridge.testing import ManualClock

KEPT = HISTORY_SIZE + 30
SKIPPED = HISTORY_SIZE + 10


def noop() -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Any]:
    apps: list[Celery] = []

    def build(**conf: Any) -> Celery:
        app = Celery(f"hs-{uuid.uuid4().hex[:6]}", broker=redis_url, set_as_current=False)
        app.conf.update(
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            result_backend=None,
            beat_schedule={
                "guarded": {"task": "hs.slow", "schedule": 1.0, "overlap": "skip"},
            },
        )
        app.conf.update(conf)
        app.task(name="hs.slow")(noop)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def test_the_beats_skipped_slots_keep_the_apps_history_size(make_app: Any, prefix: str) -> None:
    app = make_app(emq_bridge_history_size=KEPT)
    scheduler = RepeatScheduler(app)
    pump = scheduler.pump
    assert pump is not None
    clock = ManualClock(pump.repeat.server_time_ms())
    pump.clock = clock
    queue = f"{prefix}-q"
    registration = pump.repeat.get(queue, "guarded")
    assert registration is not None and registration.next_run_ms is not None
    clock.set(registration.next_run_ms)
    scheduler.tick()  # the first slot is sent; no worker starts it, so it stays in flight
    for _ in range(SKIPPED):
        clock.advance(1000)
        scheduler.tick()
    entries = pump.repeat.history(queue, "guarded", n=KEPT)
    # Every skipped slot kept (the sent one has no entry: no worker reported it).
    assert [e.status for e in entries] == ["skipped"] * SKIPPED


def test_the_pump_commands_target_carries_the_apps_history_size(make_app: Any) -> None:
    app = make_app(emq_bridge_history_size=KEPT)
    module = types.ModuleType(f"hs_app_{uuid.uuid4().hex[:6]}")
    module.app = app  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert celery_target(f"{module.__name__}:app").history_size == KEPT
        app.conf.emq_bridge_history_size = "many"
        with pytest.raises(ConfigError, match="emq_bridge_history_size"):
            celery_target(f"{module.__name__}:app")
    finally:
        del sys.modules[module.__name__]
