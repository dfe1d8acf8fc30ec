"""A jittered schedule edited to a cadence that has no slot for the slot it had not sent yet
(every 1s -> every 2s after an odd second's nominal time, before its jittered send) counts
that slot in `missed`, as an unjittered schedule's overdue slot dropped by a change is.

Before, the slot was neither fired nor counted: the edit's pending-slot path looked only at
the new cadence's last slot, which had fired already.
"""

from __future__ import annotations

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import ManualClock, RecordingDispatcher

T0 = 1_900_000_000_000  # a multiple of 2 s
TEMPLATE = {"task": "t"}


def test_an_edit_that_drops_the_unsent_jittered_slot_counts_it(repeat: Repeat) -> None:
    clock = ManualClock(T0 + 500)
    old = define(every="1s", jitter="900ms", template=TEMPLATE)
    repeat.upsert("q", "j", definition=old, now_ms=clock())
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent, clock=clock)
    while True:  # an odd second's slot whose jittered send is at least 100 ms after it
        registration = repeat.get("q", "j")
        assert registration is not None and registration.next_run_ms is not None
        clock.set(registration.next_run_ms)
        pump.run_once()
        following = repeat.get("q", "j").next_run_ms  # type: ignore[union-attr]
        nominal = following - following % 1000
        if (nominal // 1000) % 2 == 1 and following - nominal >= 100:
            break
    fired_before = len(sent.occurrences)
    clock.set(nominal + 50)  # its nominal time passed, its send has not
    new = define(every="2s", jitter="900ms", template=TEMPLATE)
    assert repeat.upsert("q", "j", definition=new, now_ms=clock()) == "updated"
    assert repeat.get("q", "j").missed == 1  # type: ignore[union-attr]
    for _ in range(6):
        clock.advance(500)
        pump.run_once()
    fired = [o.due_ms for o in sent.occurrences[fired_before:]]
    assert nominal not in fired and all(slot % 2000 == 0 for slot in fired)
