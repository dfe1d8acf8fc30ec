"""An interval whose phase changes but not its length (an imported schedule's rhythm taken
over by the app's declaration on the grid, at the switch from celery-redbeat) runs no sooner
than one interval after its last run.

Before, the grid's next slot came first: redbeat sent a 60 s entry at :40, the emq-bridge
beat's sync took it over and sent it at :00, 20 s later ("nothing fires early at the switch",
docs/migration.md).
"""

from __future__ import annotations

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

MINUTE_MS = 60_000
T0 = 1_900_000_000_000  # 40 s past a minute of the epoch grid
TEMPLATE = {"task": "t"}


def test_a_phase_change_waits_an_interval_after_the_last_run(repeat: Repeat) -> None:
    assert T0 % MINUTE_MS == 40_000
    repeat.upsert("q", "e60", every="60s", anchor="schedule", template=TEMPLATE, now_ms=T0)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    first_slot = repeat.get("q", "e60").next_run_ms  # type: ignore[union-attr]
    assert first_slot is not None and first_slot % MINUTE_MS == 40_000
    pump.run_once(first_slot)
    (fired,) = sent.clear()
    assert fired.due_ms == first_slot
    # 10 s after that run, the app's declaration: the same minute, on the grid.
    repeat.upsert("q", "e60", every="60s", template=TEMPLATE, now_ms=first_slot + 10_000)
    taken_over = repeat.get("q", "e60")
    assert taken_over is not None and taken_over.next_run_ms is not None
    # Not the grid's next minute (20 s after the run): the first one a minute after it.
    assert taken_over.next_run_ms == first_slot + 80_000
    assert taken_over.next_run_ms % MINUTE_MS == 0


def test_a_changed_interval_keeps_the_grid_rule(repeat: Repeat) -> None:
    # docs/timing.md: 15 minutes changed to 10 at 10:21 goes on at 10:30.
    ten_past = 1_900_000_200_000 - 1_900_000_200_000 % 900_000 + 900_000  # a quarter hour
    repeat.upsert("q", "j", every="15m", template=TEMPLATE, now_ms=ten_past - 1000)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once(ten_past)
    assert len(sent.clear()) == 1
    repeat.upsert("q", "j", every="10m", template=TEMPLATE, now_ms=ten_past + 6 * MINUTE_MS)
    after = repeat.get("q", "j")
    assert after is not None and after.next_run_ms is not None
    assert after.next_run_ms == ten_past + 6 * MINUTE_MS + (
        600_000 - (ten_past + 6 * MINUTE_MS) % 600_000
    )


def test_a_bound_added_to_an_interval_keeps_its_next_slot(repeat: Repeat) -> None:
    # A bound changes the cadence digest, not the phase: the next grid slot stays (a first
    # version of the rule above moved it an interval on, from the ack's time).
    repeat.upsert("q", "e5", every="5s", template=TEMPLATE, now_ms=T0 - 1)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once(T0)
    (fired,) = sent.clear()
    assert fired.due_ms == T0
    ack_ms = T0 + 3
    repeat.client.hset(repeat.keys("q").record("e5"), "last_fired_ms", ack_ms)
    for bound in ({"end_at": "2030-06-01T00:00:00Z"}, {"start_at": "2026-01-01T00:00:00Z"}):
        repeat.upsert("q", "e5", every="5s", template=TEMPLATE, now_ms=T0 + 1000, **bound)
        assert repeat.get("q", "e5").next_run_ms == T0 + 5000  # type: ignore[union-attr]
