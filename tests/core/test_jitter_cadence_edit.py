"""A cadence changed while a jitter holds a slot back (docs/cron.md, jitter).

What the page said covered a change of the jitter only (the held slot is sent once); a
change of the cadence itself works as any cadence change: the new cadence's last slot that
has come, within the old jitter's reach and after the last slot fired, is sent at once in the
held slot's place, with its own nominal time; when the new cadence has none there, the held
slot is dropped and counted in `missed`, never sent under another name. Found by a probe
(every 1h with a 50 min jitter, edited at 01:01:25 while the 01:00 slot waited for 01:30:25).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import ManualClock, RecordingDispatcher

MIDNIGHT = datetime(2030, 1, 1, tzinfo=UTC)
MINUTE = 60_000


def _hm(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")


@pytest.mark.parametrize(
    ("name", "held_until", "new", "fired", "missed"),
    [
        # The jitter removed, the cadence kept: the held 01:00 slot is sent at once.
        ("J", "01:30", {"every": "1h"}, ["01:00", "02:00", "03:00"], 0),
        # Its phase moved: the new cadence has no slot the old jitter covered (00:10 is
        # before its reach): the held slot is dropped and counted.
        ("J", "01:30", {"every": "1h", "offset": "10m"}, ["01:10", "02:10", "03:10"], 1),
        ("J", "01:30", {"cron": "15 * * * *"}, ["01:15", "02:15", "03:15"], 1),
        # A new cadence's slot that has come within the old jitter's reach (00:45): sent at
        # once in the held slot's place, once, with its own nominal time.
        ("J", "01:30", {"every": "45m"}, ["00:45", "01:30", "02:15", "03:00"], 0),
        # The reach is the jitter back from the held slot's jittered instant, which the name
        # sets: held until 01:48:54, 00:45 is past it (the timing probe, session 38).
        ("j", "01:48", {"every": "45m"}, ["01:30", "02:15", "03:00"], 1),
    ],
)
def test_a_cadence_edit_while_a_jitter_holds_a_slot_sends_it_in_place_or_counts_it(
    repeat: Repeat,
    name: str,
    held_until: str,
    new: dict[str, Any],
    fired: list[str],
    missed: int,
) -> None:
    clock = ManualClock(MIDNIGHT)
    start_ms = clock()
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent, clock=clock)
    held = define(every="1h", jitter="50m", template={"task": "t"})
    repeat.upsert("q", name, definition=held, now_ms=clock())
    registration = repeat.get("q", name)
    assert registration is not None and registration.next_run_ms is not None
    send_at = registration.next_run_ms
    assert _hm(send_at) == held_until  # the 01:00 slot, held back by its jitter
    while clock() < start_ms + 61 * MINUTE:  # pumps tick every second until 01:01
        clock.advance(1000)
        pump.run_once()
    assert sent.occurrences == []  # the 01:00 slot waits for its jittered instant
    repeat.upsert("q", name, definition=define(template={"task": "t"}, **new), now_ms=clock())
    for _ in range(int(2.5 * 3600)):
        clock.advance(1000)
        pump.run_once()
    due = [_hm(o.due_ms) for o in sent.occurrences]
    assert due[: len(fired)] == fired
    assert len(due) == len(set(due))  # no slot twice
    final = repeat.get("q", name)
    assert final is not None and final.missed == missed
