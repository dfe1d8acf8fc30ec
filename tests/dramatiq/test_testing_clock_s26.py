"""A user's Dramatiq test on a `StubBroker` with a `ManualClock` fires exactly what is due at
the clock's time (found by a probe, session 26).

The worker's boot sync placed the schedules on the server's clock, not the test's: at the
clock's 07:50 a 15-minute actor fired 07:45 with 108,276 slots missed, and a weekday cron
fired the Friday before. Now the registry takes the test's clock (`fake_repeat(clock=)`,
or `manual_pump` gives it its own). A real `dramatiq.Worker` on a `StubBroker`, as the
Dramatiq guide's "In your tests" says.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    RecurringMiddleware,
    current_occurrence,
    recurring,
)
from emq_bridge.testing import ManualClock, fake_repeat, manual_pump

UTC = timezone.utc


@pytest.mark.parametrize("clock_given", ["fake_repeat", "manual_pump"])
def test_a_stub_broker_test_fires_what_is_due_at_the_clocks_time(clock_given: str) -> None:
    clock = ManualClock(datetime(2030, 1, 7, 7, 50, tzinfo=UTC))  # a Monday, 08:50 in Paris
    repeat = fake_repeat(clock=clock) if clock_given == "fake_repeat" else fake_repeat()
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False))
    runs: list[tuple[str, datetime]] = []

    def ran(name: str) -> None:
        occurrence = current_occurrence()
        assert occurrence is not None
        runs.append((name, datetime.fromtimestamp(occurrence.due_ms / 1000, UTC)))

    @recurring(every="15m")
    @dramatiq.actor(broker=broker, queue_name="reports")
    def refresh_reports() -> None:
        ran("refresh_reports")

    @recurring(cron="0 9 * * 1-5", tz="Europe/Paris")
    @dramatiq.actor(broker=broker, queue_name="digests")
    def send_digest() -> None:
        ran("send_digest")

    pump = manual_pump(repeat, ["reports", "digests"], clock, DramatiqDispatcher(broker))
    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()  # its boot sync, on the registry's clock: the test's
    try:
        assert pump.run_once().dispatched == []  # 07:50: nothing is due
        clock.advance(timedelta(minutes=10))
        sent = pump.run_once().dispatched
        assert sorted((o.name, o.missed) for o in sent) == [
            ("refresh_reports", 0),
            ("send_digest", 0),
        ]
        broker.join("reports")
        broker.join("digests")
        worker.join()
    finally:
        worker.stop()
    at_eight = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
    assert sorted(runs) == [("refresh_reports", at_eight), ("send_digest", at_eight)]
