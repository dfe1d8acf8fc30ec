"""Celery's eager mode (`task_always_eager`), as users set it in their unit tests (probe s32).

Under `task_always_eager` `apply_async` runs the task in the calling process and publishes
nothing. Three defects met there:

* `PipelinedCeleryDispatcher` learned a message's shape by sending it through `apply_async`
  into a capturing producer: eager mode ran the task instead (under marker values: task id
  `emq-marker-id-...`, `emq_due_ms` `emq-marker-due-...`, `nominal_time` raising), captured
  nothing, and the occurrence went the normal way, running a second time. Now eager mode
  sends every occurrence the normal way only: one run, its real id and headers.
* With `task_eager_propagates`, a failing task's exception came out of `apply_async`, so the
  send counted failed, the lease was kept and the occurrence was sent (run) again after it.
  Now it counts as sent and its error is logged once at ERROR, as Celery's beat does; its
  run is reported `failed` (Celery sends no `task_failure` then: `task_internal_error`).
* The reports of an eager run went to the app's configured registry (the developer's own
  Redis), not the test's. `report_to(app, repeat)` now makes this process's reporter for the
  app send to the test's registry (stopping one made before, once it sent what it queued).

The test's registry is fakeredis (`fake_repeat`), as a user's unit test has it; the app's
configured registry is the real test server, to prove what reaches it and what does not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge import Repeat
from emq_bridge.celery import (
    CeleryDispatcher,
    PipelinedCeleryDispatcher,
    nominal_due_ms,
    nominal_time,
    reporter_for,
    sync_app,
)
from emq_bridge.celery.dispatch import SCHEDULE_HEADER, header
from emq_bridge.testing import ManualClock, fake_repeat, manual_pump

HOUR_S = 3600.0
# 02:59:59 UTC: the hourly entries are due at 03:00 (one slot each, a second later).
START = datetime(2030, 1, 1, 2, 59, 59, tzinfo=timezone.utc)
Runs = list[tuple[str, Any, Any, Any]]


@pytest.fixture
def eager_app(redis_url: str, prefix: str) -> Iterator[tuple[Celery, Runs]]:
    """An eager app whose configured registry is the test server (under `prefix`): a good
    task (`ok`) and a failing one (`flaky`), both hourly, recording each run."""
    app = Celery(f"eager-{prefix}", broker=redis_url, set_as_current=False)
    queue = f"{prefix}-q"
    app.conf.update(
        timezone="UTC",
        task_always_eager=True,
        task_default_queue=queue,
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        beat_schedule={
            "ok": {"task": "eager.ok", "schedule": HOUR_S},
            "flaky": {"task": "eager.flaky", "schedule": HOUR_S, "pause_after_failures": 1},
        },
        result_backend=None,
    )
    runs: Runs = []

    def ok(self: Any) -> None:
        # `nominal_time` raised ValueError on the marker copy's `emq-marker-due-...`.
        slot = nominal_time(self.request)
        runs.append(("ok", self.request.id, nominal_due_ms(self.request), slot))

    def flaky(self: Any) -> None:
        runs.append(("flaky", self.request.id, header(self.request, SCHEDULE_HEADER), None))
        raise RuntimeError("boom")

    app.task(name="eager.ok", bind=True, shared=False)(ok)
    app.task(name="eager.flaky", bind=True, shared=False)(flaky)
    yield app, runs
    app.close()


Dispatchers = Callable[[Celery], Any]
DISPATCHERS = pytest.mark.parametrize(
    "make", [CeleryDispatcher, PipelinedCeleryDispatcher], ids=["apply_async", "pipelined"]
)


@DISPATCHERS
def test_each_occurrence_runs_once_with_its_real_id_and_headers(
    eager_app: tuple[Celery, Runs], prefix: str, make: Dispatchers
) -> None:
    app, runs = eager_app
    app.conf.emq_bridge_report = False  # the runs are the subject here, not their reports
    queue = f"{prefix}-q"
    clock = ManualClock(START)
    repeat = fake_repeat(clock=clock)
    sync_app(app, repeat)
    pump = manual_pump(repeat, [queue], clock, make(app))
    clock.advance(1000)
    tick = pump.run_once()
    due = {o.name: o for o in tick.dispatched}
    assert sorted(due) == ["flaky", "ok"] and tick.failed == []
    slot = datetime(2030, 1, 1, 3, tzinfo=timezone.utc)
    assert sorted(runs) == [
        ("flaky", due["flaky"].id, f"{queue}/flaky", None),
        ("ok", due["ok"].id, due["ok"].due_ms, slot),
    ]
    assert not any("emq-marker" in repr(run) for run in runs)


@DISPATCHERS
def test_an_eager_failure_propagated_is_sent_once_logged_once_and_reported_failed(
    eager_app: tuple[Celery, Runs],
    prefix: str,
    make: Dispatchers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, runs = eager_app
    app.conf.task_eager_propagates = True
    queue = f"{prefix}-q"
    clock = ManualClock(START)
    repeat = fake_repeat(clock=clock)
    sync_app(app, repeat)
    reporter = _report_to(app, repeat)
    pump = manual_pump(repeat, [queue], clock, make(app))
    caplog.set_level(logging.INFO)
    clock.advance(1000)
    tick = pump.run_once()
    assert [o.name for o in tick.failed] == []  # the task failed, not the send: acked
    (flaky,) = [o for o in tick.dispatched if o.name == "flaky"]
    clock.advance(timedelta(seconds=pump.lease_ms / 1000 + 5))  # past the lease
    again = pump.run_once()
    assert again.dispatched == [] and again.failed == []  # nothing re-sent
    assert [run[0] for run in runs].count("flaky") == 1
    assert repeat.leases(queue) == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    (logged,) = errors
    assert logged.name == "emq_bridge.celery.dispatch"
    assert "Message Error" in logged.getMessage() and flaky.id in logged.getMessage()
    assert logged.exc_info is not None and isinstance(logged.exc_info[1], RuntimeError)
    # Its run reported failed (Celery sends no `task_failure` when it propagates), and
    # `pause_after_failures=1` paused it: in the test's registry.
    assert reporter.flush()
    history = repeat.history(queue, "flaky")
    assert [(e.id, e.status, e.error) for e in history] == [
        (flaky.id, "failed", "RuntimeError: boom")
    ]
    registration = repeat.get(queue, "flaky")
    assert registration is not None and registration.paused and registration.failures == 1


def test_report_to_sends_the_reports_to_the_tests_registry_not_the_apps(
    eager_app: tuple[Celery, Runs], prefix: str, client: redis.Redis
) -> None:
    app, _ = eager_app
    queue = f"{prefix}-q"
    # The app's own registry (a developer's Redis) holds the app's schedules too.
    configured = Repeat(client, prefix)
    sync_app(app, configured)
    clock = ManualClock(START)
    # The test's registry under the app's prefix: a worker takes a task for an occurrence
    # only when its id is the one its reporting registry's pumps give it.
    repeat = fake_repeat(prefix, clock=clock)
    sync_app(app, repeat)
    pump = manual_pump(repeat, [queue], clock, CeleryDispatcher(app))

    # Without report_to, the first slot's reports go where the app's settings say.
    clock.advance(1000)
    first = {o.name: o.id for o in pump.run_once().dispatched}
    before = reporter_for(app)
    assert before is not None and before.flush()
    assert [e.id for e in configured.history(queue, "ok")] == [first["ok"]]

    reporter = _report_to(app, repeat)
    assert reporter_for(app) is reporter and before._closed  # the old one stopped
    clock.advance(timedelta(hours=1))
    second = {o.name: o.id for o in pump.run_once().dispatched}
    assert reporter.flush()
    assert [(e.id, e.status) for e in repeat.history(queue, "ok")] == [(second["ok"], "succeeded")]
    assert [(e.id, e.status) for e in repeat.history(queue, "flaky")] == [
        (second["flaky"], "failed")
    ]
    # Nothing of the second slot reached the app's registry: the history is the first
    # slot's, and its `pause_after_failures=1` schedule paused at the first slot only.
    assert [e.id for e in configured.history(queue, "ok")] == [first["ok"]]
    assert [e.id for e in configured.history(queue, "flaky")] == [first["flaky"]]
    kept = configured.get(queue, "flaky")
    assert kept is not None and kept.failures == 1


def _report_to(app: Celery, repeat: Repeat) -> Any:
    from emq_bridge.celery import report_to  # new in this fix: the old code lacks it

    return report_to(app, repeat)
