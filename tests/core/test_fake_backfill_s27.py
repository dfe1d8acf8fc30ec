"""The testing helpers (`emq_bridge.testing.fake_repeat`, on fakeredis) run a backfill and the
claim that judges its queued slots by the schedule's later changes: the scripts use nothing
fakeredis's Lua lacks (it has no `redis.sha1hex`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from emq_bridge import Pump
from emq_bridge.testing import ManualClock, RecordingDispatcher, fake_repeat

START = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_a_backfill_and_a_later_bound_on_fakeredis() -> None:
    clock = ManualClock(START)
    repeat = fake_repeat(clock=clock)
    repeat.register("q", "n", every="1h", template={"task": "t"}, now_ms=clock())
    clock.advance(timedelta(hours=5, minutes=30))
    Pump(repeat, ["q"], RecordingDispatcher(), clock=clock).run_once()  # the live slot
    queued = repeat.backfill("q", "n", start=START, end=START + timedelta(hours=4))
    assert len(queued.queued) == 5
    # A start moved past the first three: those are dropped when they come due.
    later = START + timedelta(hours=3)
    repeat.upsert("q", "n", every="1h", template={"task": "t"}, start_at=later, now_ms=clock())
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    for _ in range(20):
        pump.run_once()
        clock.advance(timedelta(seconds=1))
    backfilled = sorted(o.due_ms for o in recorder.occurrences if o.backfill)
    hour = 3_600_000
    first = round(START.timestamp() * 1000)
    assert backfilled == [first + 3 * hour, first + 4 * hour]
