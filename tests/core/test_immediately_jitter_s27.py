"""`immediately=True` on a jittered schedule: the immediate run is the registration instant
itself (its `due_ms`, its id), as without jitter, never the grid slot before it.

Before, the pump mapped the immediate run's score (the registration instant, no jittered
slot) to the largest slot within the jitter's reach: registered at 10:07:23 with
`every="1h", jitter="10m"`, it went out as the 10:00 slot, a slot from before the
registration; a schedule that fired 10:00 and was replaced at 10:07:23 with `immediately`
sent the 10:00 occurrence's id a second time, not marked redelivered (found by session 27's
bounds probe).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from emq_bridge import Pump, Repeat, define, jitter, occurrence_id
from emq_bridge.testing import ManualClock, RecordingDispatcher

UTC = timezone.utc
MIN = 60_000
HOUR = 60 * MIN
TEMPLATE = {"task": "t"}


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


TEN = ms(datetime(2030, 1, 1, 10, tzinfo=UTC))  # a slot of every="1h"


def pump_until(pump: Pump, clock: ManualClock, end_ms: int) -> None:
    """Run the pump once a minute (and at the start) up to `end_ms`."""
    pump.run_once()
    while clock() < end_ms:
        clock.advance(MIN)
        pump.run_once()


@pytest.mark.parametrize("write", ["register", "upsert"])
@pytest.mark.parametrize("bound", [None, "10m"])
def test_the_immediate_run_is_the_registration_instant_with_or_without_jitter(
    repeat: Repeat, write: str, bound: str | None
) -> None:
    created = TEN + 7 * MIN + 23_000  # 10:07:23: the 10:00 slot is within the jitter's reach
    clock = ManualClock(created)
    definition = define(every="1h", jitter=bound, immediately=True, template=TEMPLATE)
    getattr(repeat, write)("q", "imm", definition=definition, now_ms=clock())
    sent = RecordingDispatcher()
    pump_until(Pump(repeat, ["q"], sent, clock=clock), clock, TEN + 3 * HOUR + 11 * MIN)
    dues = [o.due_ms for o in sent.occurrences]
    assert dues == [created, TEN + HOUR, TEN + 2 * HOUR, TEN + 3 * HOUR]
    first = sent.occurrences[0]
    assert first.id == occurrence_id(repeat.prefix, "q", "imm", created)
    assert first.released_ms == created
    assert len({o.id for o in sent.occurrences}) == len(dues)


def test_an_immediate_start_at_within_the_jitter_reach_is_its_own_time(repeat: Repeat) -> None:
    start = TEN + 5 * MIN  # 10:05:00, registered at 09:00: 10:00 is within 10 minutes
    clock = ManualClock(TEN - HOUR)
    definition = define(
        every="1h",
        jitter="10m",
        immediately=True,
        start_at=datetime.fromtimestamp(start / 1000, UTC),
        template=TEMPLATE,
    )
    repeat.register("q", "imm", definition=definition, now_ms=clock())
    sent = RecordingDispatcher()
    pump_until(Pump(repeat, ["q"], sent, clock=clock), clock, TEN + 2 * HOUR + 11 * MIN)
    assert [o.due_ms for o in sent.occurrences] == [start, TEN + HOUR, TEN + 2 * HOUR]


@pytest.mark.parametrize("later_ms", [0, 23_000])
def test_a_replaced_schedule_immediate_run_never_reuses_the_fired_slot_id(
    repeat: Repeat, later_ms: int
) -> None:
    clock = ManualClock(TEN - 10 * MIN)
    jittered = define(every="1h", jitter="10m", template=TEMPLATE)
    repeat.register("q", "poll", definition=jittered, now_ms=clock())
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent, clock=clock)
    old = repeat.get("q", "poll")
    assert old is not None and old.next_run_ms is not None
    sent_at = old.next_run_ms  # the 10:00 slot's jittered instant
    assert TEN < sent_at < TEN + 10 * MIN - later_ms  # sent late, 10:00 still in reach
    clock.set(sent_at)
    pump.run_once()
    assert [o.due_ms for o in sent.occurrences] == [TEN]
    # Replaced (cancel + register, as `emq-bridge add --replace --immediately`), at the very
    # instant it sent 10:00 or a little later.
    clock.set(sent_at + later_ms)
    assert repeat.cancel("q", "poll")
    again = define(every="1h", jitter="10m", immediately=True, template=TEMPLATE)
    repeat.register("q", "poll", definition=again, now_ms=clock())
    pump_until(pump, clock, TEN + HOUR + 11 * MIN)
    occurrences = sent.occurrences
    assert [o.due_ms for o in occurrences] == [TEN, sent_at + later_ms, TEN + HOUR]
    assert len({o.id for o in occurrences}) == 3
    assert not any(o.redelivered for o in occurrences)


def test_nominal_slot_leaves_the_immediate_instant_and_maps_the_jittered_ones() -> None:
    fields = {"immediately": "1", "created_ms": str(TEN + 7 * MIN)}
    cadence = define(every="1h", jitter="10m", template=TEMPLATE).for_name("n").cadence
    immediate = jitter.immediate_instant(fields)
    assert immediate == TEN + 7 * MIN
    assert jitter.nominal_slot(cadence, TEN + 7 * MIN, immediate) == TEN + 7 * MIN
    assert jitter.nominal_slot(cadence, TEN + 7 * MIN + 1, immediate) == TEN  # another score
    assert jitter.nominal_slot(cadence, TEN + 7 * MIN) == TEN  # no immediate run to tell apart
    # The start when later than the creation; none without `immediately` or a readable time.
    assert jitter.immediate_instant({**fields, "start_ms": str(TEN + 8 * MIN)}) == TEN + 8 * MIN
    assert jitter.immediate_instant({**fields, "start_ms": str(TEN)}) == TEN + 7 * MIN
    assert jitter.immediate_instant({"created_ms": str(TEN)}) is None
    assert jitter.immediate_instant({"immediately": "1", "created_ms": "x1"}) is None
