"""A unit test pumping a guarded schedule under `task_always_eager` (celery.md, "In your
tests"): each occurrence runs inside `pump.run_once()`, and its reports are sent before
`run_once()` returns. Before (session 39's probe of the test helpers), they left from the
reporter's thread later: the next `run_once()` found the run still in flight, so a `skip`
schedule pumped four times ran once and skipped three slots, unless the test flushed the
reporter between pumps, which the docs did not ask for."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from celery import Celery

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher, recurring, report_to, sync_app
from emq_bridge.testing import ManualClock, fake_repeat, manual_pump


def pumped(app: Celery) -> tuple[ManualClock, Repeat, Pump]:
    """The unit test's set-up (celery.md, "In your tests"): a fake registry on a manual
    clock, the app's schedules synced, its runs' reports sent there, and a manual pump."""
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=timezone.utc))
    repeat = fake_repeat(clock=clock)
    sync_app(app, repeat)
    report_to(app, repeat)
    return clock, repeat, manual_pump(repeat, ["celery"], clock, CeleryDispatcher(app))


def test_a_skip_schedule_pumped_eagerly_runs_every_slot_without_a_flush() -> None:
    app = Celery("eagerskip", broker="memory://")
    app.conf.update(task_always_eager=True)
    runs: list[int] = []

    @recurring(every="5m", name="inventory", overlap="skip")
    @app.task(name="eagerskip.inventory")
    def inventory() -> None:
        runs.append(1)

    clock, repeat, pump = pumped(app)
    for _ in range(4):
        clock.advance(timedelta(minutes=5))
        pump.run_once()
    registration = repeat.get("celery", "inventory")
    assert registration is not None
    assert (len(runs), registration.skipped) == (4, 0)
    assert [e.status for e in repeat.history("celery", "inventory")] == ["succeeded"] * 4


def test_failures_that_propagate_pause_after_failures_without_a_flush() -> None:
    app = Celery("eagerfail", broker="memory://")
    app.conf.update(task_always_eager=True, task_eager_propagates=True)

    @recurring(every="1h", name="prices", pause_after_failures=2, overlap="skip")
    @app.task(name="eagerfail.prices")
    def prices() -> None:
        raise RuntimeError("upstream down")

    clock, repeat, pump = pumped(app)
    for _ in range(2):
        clock.advance(timedelta(hours=1))
        assert len(pump.run_once().dispatched) == 1
    registration = repeat.get("celery", "prices")
    assert registration is not None and registration.paused
    assert registration.failures == 2 and registration.skipped == 0


def test_a_task_that_is_no_occurrence_applied_eagerly_never_waits_on_the_registry() -> None:
    # The session's review: the flush ran after any eager task, so a worker's task calling
    # `other.apply()` waited for the reporter (up to FLUSH_S) while the registry hung.
    import os
    import signal
    import time

    import redis

    from emq_bridge import Repeat
    from emq_bridge.embedded import EmbeddedServer
    from emq_bridge.lifecycle import report_of
    from emq_bridge.occurrence import Occurrence

    app = Celery("eagerplain", broker="memory://")

    @app.task(name="eagerplain.inner")
    def inner() -> int:
        return 1

    with EmbeddedServer() as server, redis.Redis.from_url(server.url, socket_timeout=5) as client:
        repeat = Repeat(client, "plain")
        reporter = report_to(app, repeat)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            # Something waits in the reporter, which the hung registry does not take.
            occurrence = Occurrence("q", "job", 1_900_000_000_000, "an-id", {}, 1_900_000_000_000)
            reporter.report(report_of("succeeded", occurrence))
            started = time.monotonic()
            assert inner.apply().get() == 1
            assert time.monotonic() - started < 1.0  # no flush: 2 s before
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            reporter.close(5.0)
