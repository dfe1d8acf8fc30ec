"""Two edit rules docs/timing.md now states where users look for them (a probe of live pumps
found both undocumented outside the `anchor` paragraph and the creation rule):

- changing only an interval's `offset` never brings a run sooner than one interval after
  the last run, so the new grid's slot inside that interval does not fire;
- a one-off instant already past when an edit adds it does not fire and is not counted
  missed, as at creation.
"""

from __future__ import annotations

from datetime import datetime, timezone

from emq_bridge import Repeat, define
from emq_bridge.testing import ManualClock, RecordingDispatcher, manual_pump

TEMPLATE = {"task": "t"}
T = int(datetime(2030, 1, 1, 10, 0, tzinfo=timezone.utc).timestamp() * 1000)  # on a 15 s grid


def _instant(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def test_an_offset_change_keeps_one_interval_after_the_last_run(repeat: Repeat) -> None:
    clock = ManualClock(T)
    sent = RecordingDispatcher()
    pump = manual_pump(repeat, ["q"], clock, sent)
    repeat.upsert("q", "x", definition=define(every="15s", template=TEMPLATE), now_ms=T - 1)
    pump.run_once()
    assert [o.due_ms for o in sent.clear()] == [T]
    clock.set(T + 3_000)
    edited = define(every="15s", offset="5s", template=TEMPLATE)
    assert repeat.upsert("q", "x", definition=edited, now_ms=clock()) == "updated"
    for at in (T + 5_000, T + 19_999):  # the new grid's T+5 s is inside the interval
        clock.set(at)
        pump.run_once()
    assert sent.clear() == []
    clock.set(T + 20_000)
    pump.run_once()
    assert [o.due_ms for o in sent.clear()] == [T + 20_000]
    registration = repeat.get("q", "x")
    assert registration is not None and registration.missed == 0


def test_a_one_off_instant_already_past_when_an_edit_adds_it_does_not_fire(
    repeat: Repeat,
) -> None:
    clock = ManualClock(T)
    sent = RecordingDispatcher()
    pump = manual_pump(repeat, ["q"], clock, sent)
    first = define(at=[_instant(T + 20_000)], template=TEMPLATE)
    repeat.upsert("q", "once", definition=first, now_ms=T)
    clock.set(T + 20_000)
    pump.run_once()
    assert [o.due_ms for o in sent.clear()] == [T + 20_000]
    clock.set(T + 51_000)
    edited = define(at=[_instant(T + t) for t in (20_000, 25_000, 300_000)], template=TEMPLATE)
    assert repeat.upsert("q", "once", definition=edited, now_ms=clock()) == "updated"
    pump.run_once()
    assert sent.clear() == []  # neither T+20 s (fired) nor T+25 s (past when added)
    registration = repeat.get("q", "once")
    assert registration is not None and registration.missed == 0
    assert registration.next_run_ms == T + 300_000
    clock.set(T + 300_000)
    pump.run_once()
    assert [o.due_ms for o in sent.clear()] == [T + 300_000]
