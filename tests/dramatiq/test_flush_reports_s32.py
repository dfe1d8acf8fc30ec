"""A user's Dramatiq test on a `StubBroker`, as the Dramatiq guide's "In your tests" says (found
by a probe, session 32).

* The outcome reports leave the worker from a background thread: a test that read
  `repeat.history(...)` right after `stub_broker.join(queue)` and `worker.join()` found it
  empty 19 times in 20, unless it reached into `middleware.outcomes` (no public API).
  `RecurringMiddleware.flush_reports()` waits for them.
* `RecurringMiddleware(fake_repeat(clock=clock))` with its default `run_pump=True`: the pump
  thread scanned on the server's clock while the boot sync placed the schedules at the test's
  2030, so advancing the clock fired nothing, silently. The pump runs on the registry's clock.

A real `dramatiq.Worker` on a `StubBroker`, in process, on `fake_repeat`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    RecurringMiddleware,
    current_occurrence,
    recurring,
)
from emq_bridge.testing import ManualClock, fake_repeat, manual_pump

UTC = timezone.utc


class App:
    """A `StubBroker` app of two hourly actors, one that fails and one that succeeds."""

    def __init__(self, repeat: Repeat, **options: object) -> None:
        self.repeat = repeat
        self.broker = StubBroker()
        self.middleware = RecurringMiddleware(repeat, **options)  # type: ignore[arg-type]
        self.broker.add_middleware(self.middleware)
        self.ran: list[tuple[str, int]] = []
        self.ran_event = threading.Event()

        def ran(name: str) -> None:
            occurrence = current_occurrence()
            assert occurrence is not None
            self.ran.append((name, occurrence.due_ms))
            self.ran_event.set()

        @recurring(every="1h")
        @dramatiq.actor(broker=self.broker, queue_name="reports")
        def refresh() -> None:
            ran("refresh")

        @recurring(every="1h", pause_after_failures=3)
        @dramatiq.actor(broker=self.broker, queue_name="reports", max_retries=0)
        def fragile() -> None:
            ran("fragile")
            raise RuntimeError("the report server is down")

        self.worker = dramatiq.Worker(self.broker, worker_timeout=50)


@pytest.fixture
def started() -> Iterator[list[App]]:
    apps: list[App] = []
    yield apps
    for app in apps:
        app.worker.stop()
        app.broker.close()


@pytest.mark.parametrize("attempt", range(5))
def test_history_is_there_once_the_reports_are_flushed(started: list[App], attempt: int) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 0, 59, 59, tzinfo=UTC))
    app = App(fake_repeat(clock=clock), run_pump=False)
    app.worker.start()
    started.append(app)
    pump = manual_pump(app.repeat, ["reports"], clock, DramatiqDispatcher(app.broker))
    clock.advance(1000)  # 01:00: both are due
    assert sorted(o.name for o in pump.run_once().dispatched) == ["fragile", "refresh"]
    app.broker.join("reports", fail_fast=False)
    app.worker.join()

    assert app.middleware.flush_reports(5) is True
    [failed] = app.repeat.history("reports", "fragile")
    [succeeded] = app.repeat.history("reports", "refresh")
    assert (failed.status, succeeded.status) == ("failed", "succeeded")
    fragile = app.repeat.get("reports", "fragile")
    assert fragile is not None and fragile.failures == 1


def test_flush_reports_with_nothing_reported() -> None:
    assert RecurringMiddleware(fake_repeat(), run_pump=False).flush_reports() is True
    silent = RecurringMiddleware(fake_repeat(), run_pump=False, report=False)
    assert silent.flush_reports(0.1) is True


def test_the_worker_pump_thread_runs_on_the_registrys_clock(started: list[App]) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 0, 59, 59, tzinfo=UTC))
    app = App(fake_repeat(clock=clock), max_sleep_s=0.1)  # run_pump: the default, True
    app.worker.start()  # the boot sync places both at 01:00, the clock's
    started.append(app)
    time.sleep(0.5)  # a few ticks of the pump thread: nothing is due at 00:59:59
    assert app.ran == []

    clock.advance(timedelta(seconds=1))
    assert app.ran_event.wait(10), "the pump thread fired nothing after the clock advanced"
    app.broker.join("reports", fail_fast=False)
    app.worker.join()
    at_one = int(datetime(2030, 1, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert sorted(app.ran) == [("fragile", at_one), ("refresh", at_one)]
    assert app.middleware.flush_reports(5) is True
    [entry] = app.repeat.history("reports", "refresh")
    assert entry.status == "succeeded"
