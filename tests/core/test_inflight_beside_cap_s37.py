"""What lifecycle.md says of the runs kept in flight beside a guarded registration's own
(`inflight_also`, at most 16): while one of the 17 newest runs, the next slot is skipped;
past that cap the oldest are forgotten, and the next slot waits only on the newest (found by
a probe of the docs' claims, session 37: the cap was told, not which runs it forgets)."""

from __future__ import annotations

import pytest

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TRIGGERS = 20


def _triggered_runs(repeat: Repeat) -> tuple[Pump, RecordingDispatcher, list[Occurrence]]:
    repeat.upsert("q", "g", every="1h", template={"task": "t"}, overlap="skip")
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    runs: list[Occurrence] = []
    for _ in range(TRIGGERS):  # an operator's triggers, sent whatever the policy
        repeat.trigger("q", "g")
        pump.run_once()
        runs += sent.clear()
    for run in runs:
        assert repeat.started(run)
    return pump, sent, runs


@pytest.mark.parametrize(
    ("still_running", "next_slot_sent"),
    [({17, 18, 19}, False), ({1, 2, 3}, True)],
    ids=["newest-running: skipped", "only-the-oldest-running: forgotten"],
)
def test_the_next_slot_waits_on_the_newest_runs_beside_it(
    repeat: Repeat, still_running: set[int], next_slot_sent: bool
) -> None:
    pump, sent, runs = _triggered_runs(repeat)
    for index, run in enumerate(runs):
        if index not in still_running:
            assert repeat.finished(run, ok=True)
    registration = repeat.get("q", "g")
    assert registration is not None and registration.next_run_ms is not None
    pump.run_once(now_ms=registration.next_run_ms + 10)
    assert bool(sent.clear()) is next_slot_sent
