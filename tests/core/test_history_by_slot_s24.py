"""`Repeat.history` lists a registration's occurrences newest slot first. A `buffer_one`
slot's entry is made when the slot is released, after the entries of the slots skipped while
it waited; read in the order entries were made, the top row was an older slot, not the
latest one (found with a real Celery worker: 04:26:00 running above 04:26:10 skipped)."""

from __future__ import annotations

from emq_bridge import Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

T0 = 1_900_000_000_000


def test_a_buffered_slot_released_after_skipped_ones_is_listed_in_slot_order(
    repeat: Repeat,
) -> None:
    clock = ManualClock(T0)
    repeat.upsert("q", "b", every="1s", overlap="buffer_one", template={"task": "t"}, now_ms=T0)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent, clock=clock)
    for _ in range(4):
        clock.advance(1000)
        pump.run_once()  # 1000 runs, 2000 is buffered, 3000 and 4000 are skipped
    first = sent.occurrences[0]
    assert repeat.started(first) and repeat.finished(first, ok=True)
    pump.run_once()  # the buffered slot (2000) is sent now: its entry is made last
    released = sent.occurrences[-1]
    assert released.due_ms == T0 + 2000
    assert repeat.started(released)

    history = repeat.history("q", "b")
    assert [(e.due_ms - T0, e.status) for e in history] == [
        (4000, "skipped"),
        (3000, "skipped"),
        (2000, "running"),
        (1000, "succeeded"),
    ]
    # The newest n slots, whichever entries were made last (here 1000's and 2000's).
    assert [e.due_ms - T0 for e in repeat.history("q", "b", 3)] == [4000, 3000, 2000]
