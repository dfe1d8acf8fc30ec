"""A buffered slot left by an edit from buffer_one to allow never moves `last_due_ms` back:
the next occurrence's previous slot is the last one fired, and the guards that read
`last_due_ms` keep their floor.

Before, the release (lost.lua, report.lua) set `last_due_ms` to the released, older slot: the
next occurrence said its previous slot was that one. Since session 36 the claim under
`allow` drops such a slot, counted missed (a probe found it could wait for good behind
`allow`'s overlapping runs: tests/core/test_buffered_after_policy_edit_s36.py), so the run's
end releases nothing.
"""

from __future__ import annotations

import pytest

from emq_bridge import Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

T0 = 1_900_000_000_000
TEMPLATE = {"task": "t"}


@pytest.mark.parametrize("ends", ["lost", "finished"])
def test_a_late_released_buffered_slot_leaves_the_last_fired_slot(
    repeat: Repeat, ends: str
) -> None:
    clock = ManualClock(T0)
    repeat.upsert("q", "b", every="1s", overlap="buffer_one", template=TEMPLATE, now_ms=T0)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent, clock=clock)

    def tick() -> None:
        clock.advance(1000)
        pump.run_once()

    for _ in range(3):
        tick()  # 1000 runs (never reported), 2000 is buffered, 3000 skipped
    first = sent.occurrences[0]
    record = repeat.keys("q").record("b")
    assert repeat.client.hget(record, "buffered") == str(T0 + 2000).encode()
    repeat.upsert("q", "b", every="1s", template=TEMPLATE, now_ms=clock())  # overlap allow
    tick()
    tick()
    assert int(repeat.client.hget(record, "last_due_ms")) == T0 + 5000
    if ends == "lost":
        member = f"b {first.due_ms}"
        repeat.client.zadd(repeat.keys("q").running, {member: 0})
        assert repeat.mark_lost("q", [member])
    else:
        assert repeat.started(first) and repeat.finished(first, ok=True)
    before = len(sent.occurrences)
    pump.run_once()  # the buffered slot was dropped at the first claim under allow
    assert len(sent.occurrences) == before
    assert repeat.client.hget(record, "buffered") is None
    assert int(repeat.client.hget(record, "missed")) >= 1
    assert int(repeat.client.hget(record, "last_due_ms")) == T0 + 5000
    tick()
    following = sent.occurrences[-1]
    assert (following.due_ms, following.previous_due_ms) == (T0 + 6000, T0 + 5000)
