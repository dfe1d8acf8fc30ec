"""dramatiq.md, "In your tests": a guarded schedule pumped on a `StubBroker`, with a worker in
the test's process, runs every slot when the test flushes the reports before each next
`pump.run_once()` (the reports leave from a background thread; an occurrence whose end is
not in is in flight, and the next slot would be skipped as overlapping it)."""

from __future__ import annotations

from datetime import timedelta

import dramatiq
from dramatiq.brokers.stub import StubBroker

from emq_bridge.dramatiq import DramatiqDispatcher, RecurringMiddleware, recurring
from emq_bridge.testing import ManualClock, fake_repeat, manual_pump


def test_a_skip_schedule_runs_every_slot_when_reports_are_flushed_between_pumps() -> None:
    clock = ManualClock()
    repeat = fake_repeat(clock=clock)
    broker = StubBroker()
    middleware = RecurringMiddleware(repeat, run_pump=False)
    broker.add_middleware(middleware)
    runs: list[int] = []

    @recurring(every="1h", overlap="skip")
    @dramatiq.actor(broker=broker, queue_name="reports")
    def refresh() -> None:
        runs.append(1)

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        pump = manual_pump(repeat, ["reports"], clock, DramatiqDispatcher(broker))
        for _ in range(4):
            clock.advance(timedelta(hours=1))
            pump.run_once()
            broker.join("reports", fail_fast=True)
            worker.join()
            assert middleware.flush_reports()  # its end in, before the next slot's claim
        registration = repeat.get("reports", "refresh")
        assert registration is not None
        assert (len(runs), registration.skipped) == (4, 0)
    finally:
        worker.stop()
        broker.close()
