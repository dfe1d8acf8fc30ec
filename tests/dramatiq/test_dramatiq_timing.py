"""Aligned intervals, bounds and one-offs through Dramatiq: `@recurring`, `every(...)`,
`cron(...)` and the `recurring=` option, synced by a real worker's boot, fired by a pump with
a manual clock, run by the worker (each run records the nominal time it was given)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Repeat, ScheduleError
from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    RecurringMiddleware,
    cron,
    current_occurrence,
    every,
    recurring,
)
from emq_bridge.testing import ManualClock, manual_pump

LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # 2030-04-07 02:00 -> 01:30 (a 30 min shift)
MIN = 60_000


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_decorated_bounds_and_one_offs_fire_exactly_their_slots(repeat: Repeat) -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False))
    runs: list[tuple[str, int]] = []
    # The repeated half hour of Lord Howe's fall-back: 01:30-02:00 happens twice.
    start = datetime(2030, 4, 7, 1, 20, tzinfo=LORD_HOWE)
    end = datetime(2030, 4, 7, 1, 50, tzinfo=LORD_HOWE, fold=1)
    twice = [datetime(2030, 4, 7, 1, 45, tzinfo=LORD_HOWE, fold=fold) for fold in (0, 1)]

    def note() -> None:
        info = current_occurrence()
        assert info is not None
        runs.append((info.name, info.due_ms))

    @recurring(every="10m", start_at=start, end_at=end, name="window")
    @recurring(at=twice, name="twice")
    @dramatiq.actor(broker=broker, queue_name="timing")
    def job() -> None:
        note()

    @dramatiq.actor(
        broker=broker,
        queue_name="timing",
        recurring=[
            every("15m", offset="5m", limit=3, start_at=start, name="three"),
            cron("*/20 * * * *", tz="Australia/Lord_Howe", start_at=start, end_at=end, name="cron"),
        ],
    )
    def other() -> None:
        note()

    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()  # the boot syncs the declared schedules
    try:
        clock = ManualClock(ms(start) - 45 * MIN)
        pump = manual_pump(repeat, ["timing"], clock, DramatiqDispatcher(broker))
        while clock() <= ms(end) + 3 * 3_600_000:
            pump.run_once()
            clock.advance(4 * MIN)
        broker.join("timing", fail_fast=True)
    finally:
        worker.stop()
    fired: dict[str, list[int]] = {}
    for name, due in runs:
        fired.setdefault(name, []).append(due)
    low, high = ms(start), ms(end)
    assert high - low == 60 * MIN  # 30 min of wall clock, 60 of real time
    assert low % (10 * MIN) == 0  # 14:20 UTC: on the 10-minute grid, and the start is inclusive
    assert sorted(fired["window"]) == list(range(low, high + 1, 10 * MIN))
    assert sorted(fired["twice"]) == [ms(twice[0]), ms(twice[0]) + 30 * MIN]
    first = low + (-(low - 5 * MIN) % (15 * MIN))
    assert sorted(fired["three"]) == [first, first + 15 * MIN, first + 30 * MIN]
    # */20 follows elapsed time: 01:20 and 01:40 LHDT (+11: 14:20, 14:40 UTC), the fall-back at
    # 15:00 UTC, then 01:40 LHST (+10:30: 15:10 UTC); 02:00 LHST (15:30 UTC) is past the end.
    assert sorted(fired["cron"]) == [low, low + 20 * MIN, low + 50 * MIN]
    states = {r.name: r.completed for r in repeat.list("timing")}
    assert states == {"window": "end_at", "twice": "at", "three": "limit", "cron": "end_at"}


def test_bad_bounds_on_a_decorator_are_refused_at_import(repeat: Repeat) -> None:
    with pytest.raises(ScheduleError, match="no time zone"):
        recurring(every="1h", end_at=datetime(2030, 1, 1))
    with pytest.raises(ScheduleError, match="immediately does not apply"):
        recurring(at=datetime(2030, 1, 1, tzinfo=timezone.utc), immediately=True)
    with pytest.raises(ScheduleError, match="limit"):
        every("1h", limit=0)
    assert every("1h", offset=timedelta(minutes=30)).bind("a", "q").definition.to_fields()[
        "offset_ms"
    ] == str(30 * MIN)
