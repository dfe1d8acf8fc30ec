"""A queue move reads the old record's counters defensively: one edited by hand into a
number of thousands of digits (past what `int()` converts) is taken as absent, and the move
goes on (found in review, session 26: the move's read raised ValueError). Real server."""

from __future__ import annotations

from emq_bridge import Declaration, Repeat, define
from emq_bridge.sync import sync

T = {"task": "t"}


def test_a_counter_of_thousands_of_digits_does_not_stop_a_move(repeat: Repeat) -> None:
    sync(repeat, [Declaration("a", "job", define(every="1h", template=T))], "src")
    repeat.client.hset(repeat.keys("a").record("job"), "fired", "9" * 5000)
    moved = sync(repeat, [Declaration("b", "job", define(every="1h", template=T))], "src")
    assert [d.queue for d in moved.create] == ["b"] and moved.remove == [("a", "job")]
    registration = repeat.get("b", "job")
    assert registration is not None and registration.fired == 0
