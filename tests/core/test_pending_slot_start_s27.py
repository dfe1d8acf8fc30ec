"""A cadence change of a jittered registration whose next run is still ahead fires the new
cadence's slot that is already past (upsert.lua's pending slot, digit 5), but never one before
its `start_at`. Before (session 27), a registration `every="1h", jitter="10m",
immediately=True, start_at=10:05` made at 09:00 and changed at 10:03 to every 30 minutes sent
the slot of 10:00, before its start, then 10:30."""

from __future__ import annotations

from datetime import datetime, timezone

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import ManualClock, RecordingDispatcher


def at(hour: int, minute: int) -> datetime:
    return datetime(2030, 1, 1, hour, minute, tzinfo=timezone.utc)


def test_no_pending_slot_before_the_start(repeat: Repeat) -> None:
    clock = ManualClock(at(9, 0))
    start = at(10, 5)
    given = dict(every="1h", jitter="10m", immediately=True, start_at=start, template={"task": "t"})
    assert repeat.upsert("q", "s", definition=define(**given), now_ms=clock()) == "created"
    clock.set(at(10, 3))
    changed = define(**{**given, "every": "30m"})
    assert repeat.upsert("q", "s", definition=changed, now_ms=clock()) == "updated"
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    for _ in range(40):
        pump.run_once()
        clock.advance(60_000)
    dues = [o.due_ms for o in recorder.occurrences]
    assert dues and min(dues) >= start.timestamp() * 1000, dues
    assert dues == [round(at(10, 30).timestamp() * 1000)]
