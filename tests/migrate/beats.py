"""emq-bridge's beat on the test registry, as the migration tests switch to it."""

from __future__ import annotations

from typing import Any

from celery import Celery

from emq_bridge.celery import RepeatScheduler
from emq_bridge.testing import ManualClock


def beat_app(
    name: str,
    redis_url: str,
    prefix: str,
    default_queue: str,
    beat_schedule: dict[str, Any],
    **conf: Any,
) -> Celery:
    """A Celery app whose beat is emq-bridge's, under the test's prefix: its tasks are sent by
    name (no task module), with no result backend; `conf` adds settings."""
    app = Celery(name, broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=default_queue,
        emq_bridge_prefix=prefix,
        beat_schedule=beat_schedule,
        emq_bridge_check_tasks=False,
        result_backend=None,
        result_expires=None,
        **conf,
    )
    return app


def run_beat(app: Celery, ticks: int) -> None:
    """Start `app`'s beat (`RepeatScheduler`: its boot sync), tick it `ticks` times a second
    apart on a manual clock from the server's time, then close it and `app`."""
    scheduler = RepeatScheduler(app)
    try:
        assert scheduler.pump is not None
        clock = ManualClock(scheduler.pump.repeat.server_time_ms())
        scheduler.pump.clock = clock
        for _ in range(ticks):
            clock.advance(1000)
            scheduler.tick()
    finally:
        scheduler.close()
        app.close()
