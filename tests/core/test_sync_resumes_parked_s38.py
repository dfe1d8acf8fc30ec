"""A sync that declares a schedule a pump parked, for a dispatch its code could not make,
resumes it; a pause by hand it leaves alone.

Found by a probe of rolling deploys (session 38): a rollback's pump parked the newer
version's schedules (their actors unknown to the old code), and rolling forward again
synced them as unchanged (the same digest) and left them parked for good, without a word;
so did the old version's schedules parked by the new version's pump and declared again by
the rollback.
"""

from __future__ import annotations

import logging
import time

import pytest

from emq_bridge import Declaration, Occurrence, Pump, Repeat, define
from emq_bridge.errors import PermanentDispatchError
from emq_bridge.sync import sync

SECOND = 1000


class Broker:
    """Refuses every task in `unknown`, as a worker whose code lacks those actors."""

    def __init__(self, *unknown: str) -> None:
        self.unknown = set(unknown)
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        if occurrence.template["task"] in self.unknown:
            raise PermanentDispatchError(f"actor {occurrence.template['task']!r} is not declared")
        self.sent.append(occurrence)


def declared(*tasks: str) -> list[Declaration]:
    return [
        Declaration("q", task, define(every="1s", template={"task": task}, immediately=True))
        for task in tasks
    ]


def parked_by_old_code(repeat: Repeat) -> int:
    """Sync the new version's `added` and `kept`, then let the old version's pump, which
    does not know `added`, park it; return the time the pump ran."""
    sync(repeat, declared("added", "kept"), "app")
    now = int(time.time() * 1000) + SECOND
    result = Pump(repeat, ["q"], Broker("added")).run_once(now_ms=now)
    assert result.parked == ["added"]
    return now


def test_a_sync_that_declares_a_parked_schedule_resumes_it_and_says_so(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    now = parked_by_old_code(any_repeat)
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        applied = sync(any_repeat, declared("added", "kept"), "app")
    assert applied.unpark == [("q", "added")]
    assert [d.name for d in applied.unchanged] == ["added", "kept"]
    [line] = [
        r.getMessage() for r in caplog.records if "parked schedule(s) resumed" in r.getMessage()
    ]
    assert line.startswith("sync app: 1 parked schedule(s) resumed: q/added (")
    added = any_repeat.get("q", "added")
    assert added is not None and not added.paused
    assert added.parked_reason is None and added.parked_ms is None
    # The new code's pump sends it again.
    broker = Broker()
    Pump(any_repeat, ["q"], broker).run_once(now_ms=now + 2 * SECOND)
    assert "added" in [o.name for o in broker.sent]
    # Resumed once: the next sync has nothing to resume.
    assert sync(any_repeat, declared("added", "kept"), "app").unpark == []


class PausingBroker(Broker):
    """An operator pauses the schedule while its occurrence is being sent, which then fails
    for good: `park.lua` parks a registration paused by hand too, keeping its pause."""

    def __init__(self, repeat: Repeat, *unknown: str) -> None:
        super().__init__(*unknown)
        self.repeat = repeat

    def dispatch(self, occurrence: Occurrence) -> None:
        self.repeat.pause(occurrence.queue, occurrence.name, note="on purpose")
        super().dispatch(occurrence)


def test_a_schedule_paused_by_hand_then_parked_stays_paused_through_a_sync(
    any_repeat: Repeat,
) -> None:
    sync(any_repeat, declared("added"), "app")
    now = int(time.time() * 1000) + SECOND
    result = Pump(any_repeat, ["q"], PausingBroker(any_repeat, "added")).run_once(now_ms=now)
    assert result.parked == ["added"]
    added = any_repeat.get("q", "added")
    assert added is not None and added.paused and added.parked_reason is not None
    applied = sync(any_repeat, declared("added"), "app")
    assert applied.unpark == []
    added = any_repeat.get("q", "added")
    assert added is not None and added.paused and added.paused_note == "on purpose"


def test_a_schedule_paused_by_hand_only_is_no_business_of_a_sync(any_repeat: Repeat) -> None:
    sync(any_repeat, declared("added"), "app")
    assert any_repeat.pause("q", "added", note="on purpose")
    assert sync(any_repeat, declared("added"), "app").unpark == []
    added = any_repeat.get("q", "added")
    assert added is not None and added.paused


def test_a_sync_of_the_code_whose_pump_parked_it_leaves_it_parked(any_repeat: Repeat) -> None:
    # Review (session 38): code that cannot send it (a typo'd actor it declares) would be
    # resumed at each of its syncs and parked again at its next slot. With a generation, the
    # park names the code that made it, and only other code resumes it.
    sync(any_repeat, declared("added"), "app", generation=2)
    now = int(time.time() * 1000) + SECOND
    pump = Pump(any_repeat, ["q"], Broker("added"), code=("app", 2))
    assert pump.run_once(now_ms=now).parked == ["added"]
    assert sync(any_repeat, declared("added"), "app", generation=2).unpark == []
    added = any_repeat.get("q", "added")
    assert added is not None and added.paused and added.parked_reason is not None
    # The next deploy's generation is other code: it resumes it.
    assert sync(any_repeat, declared("added"), "app", generation=3).unpark == [("q", "added")]
    added = any_repeat.get("q", "added")
    assert added is not None and not added.paused
