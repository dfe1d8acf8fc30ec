"""A backfill of an interval not on the epoch's grid placed slots from `--from`, not from the
schedule's phase (found by a probe backfilling with real workers, session 33): an
`anchor="schedule"` interval registered at :00:23.456 was backfilled at :59.999, a
millisecond before slots the live schedule had fired, which ran again under new ids, and a
second backfill from 17 s later queued another set. Its slots are now on its own phase (its
next run's), so a backfill sends exactly the slots the live schedule did not, once; an
`anchor="release"` interval, which has no slots, is refused. On both backends.
"""

from __future__ import annotations

import pytest

from emq_bridge import Pump, Repeat, ScheduleError, define
from emq_bridge.testing import RecordingDispatcher

T0 = 1_780_272_000_000 + 23_456  # the registration instant: phase :00:23.456
MINUTE = 60_000


def test_a_backfill_of_an_interval_of_its_own_phase_sends_its_slots_once(
    any_repeat: Repeat,
) -> None:
    definition = define(every="10m", anchor="schedule", template={"task": "t"})
    any_repeat.upsert("q", "s", definition=definition, now_ms=T0)
    live = RecordingDispatcher()
    for k in (1, 2, 3):  # the live schedule fires T0+10m, T0+20m, T0+30m
        Pump(any_repeat, ["q"], live).run_once(T0 + k * 10 * MINUTE + 5)
    assert [o.due_ms - T0 for o in live.occurrences] == [10 * MINUTE, 20 * MINUTE, 30 * MINUTE]

    now = T0 + 35 * MINUTE
    first = any_repeat.backfill("q", "s", T0 - 30 * MINUTE, T0 + 32 * MINUTE, rate=0, now_ms=now)
    # The slots of its phase before it was registered; those it fired are the live ones.
    assert [slot - T0 for slot in first.queued] == [-30 * MINUTE, -20 * MINUTE, -10 * MINUTE, 0]
    assert first.live == 3
    later = any_repeat.backfill(
        "q", "s", T0 - 30 * MINUTE + 17_000, T0 + 32 * MINUTE, rate=0, now_ms=now
    )
    assert later.queued == [] and later.done == 3  # the same slots, queued already

    sent = RecordingDispatcher()
    Pump(any_repeat, ["q"], sent).run_once(now + 1)
    assert sorted(o.due_ms for o in sent.occurrences) == first.queued
    assert all(o.backfill for o in sent.occurrences)
    fired = {o.id for o in live.occurrences}
    assert not fired & {o.id for o in sent.occurrences}


def test_a_backfill_of_an_interval_after_each_release_is_refused(any_repeat: Repeat) -> None:
    definition = define(every="10m", anchor="release", template={"task": "t"})
    any_repeat.upsert("q", "r", definition=definition, now_ms=T0)
    with pytest.raises(ScheduleError, match=r"q/r: it runs an interval after each release"):
        any_repeat.backfill("q", "r", T0 - 30 * MINUTE, T0, now_ms=T0 + MINUTE)
