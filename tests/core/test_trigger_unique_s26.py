"""Every trigger is an occurrence of its own, however close (found by a probe, session 26).

The pending trigger was "<name> <now_ms> manual" and its id the UUIDv5 of that ms, so two
triggers in one server ms were one occurrence (each caller told it triggered), and a trigger
in the ms of one a pump had already sent sent that id again, as a first send (not marked
redelivered). Now a trigger's instant is now, or one ms after the registration's last one.
Real server and fakeredis."""

from __future__ import annotations

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000


def test_two_triggers_in_one_ms_are_two_occurrences(any_repeat: Repeat) -> None:
    any_repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=T0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    first = any_repeat.trigger("q", "job", now_ms=T0 + 5)
    second = any_repeat.trigger("q", "job", now_ms=T0 + 5)
    assert first != second
    sent = pump.run_once(now_ms=T0 + 10).dispatched
    assert sorted(o.id for o in sent) == sorted([first, second])
    assert all(o.triggered and not o.redelivered for o in sent)
    assert sorted(o.due_ms for o in sent) == [T0 + 5, T0 + 6]


def test_a_trigger_after_a_sent_one_in_the_same_ms_never_sends_its_id_again(
    any_repeat: Repeat,
) -> None:
    any_repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=T0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    first = any_repeat.trigger("q", "job", now_ms=T0 + 5)
    (sent,) = pump.run_once(now_ms=T0 + 10).dispatched
    assert sent.id == first
    again = any_repeat.trigger("q", "job", now_ms=T0 + 5)  # a clock that did not move
    (resent,) = pump.run_once(now_ms=T0 + 20).dispatched
    assert resent.id == again != first and not resent.redelivered
