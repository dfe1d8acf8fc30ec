"""`Repeat.beat`: a heartbeat tells its worker when a `replace` took its run over.

A Celery worker that misses the revoke a `replace` sends (one in warm shutdown, one with
remote control off) ran the replaced run on beside its replacement. `report.lua` now names,
in its reply, the heartbeats of runs a `replace` took over: the registration's policy is
`replace`, and the run is neither its `inflight` one nor in flight beside it (`inflight_also`),
nor a trigger's or a backfill's. Only those: every other heartbeat is applied as before.
"""

from __future__ import annotations

from dataclasses import replace

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import _heartbeat
from emq_bridge.testing import RecordingDispatcher

HOUR_MS = 3_600_000


def two_slots(repeat: Repeat, overlap: str) -> tuple[Occurrence, Occurrence]:
    """Send a slot, start it, and send the next one while it runs."""
    repeat.register(
        "q", "job", every="1h", template={"task": "t"}, overlap=overlap, immediately=True
    )
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    pump.run_once()
    (first,) = sent.clear()
    assert repeat.started(first)
    pump.run_once(now_ms=first.due_ms + HOUR_MS + 1)
    (second,) = sent.clear()
    return first, second


def beat(occurrence: Occurrence) -> Report:
    return report_of("heartbeat", occurrence)


def test_the_heartbeat_of_a_replaced_run_is_returned_and_still_applied(repeat: Repeat) -> None:
    first, second = two_slots(repeat, "replace")
    replaced = repeat.beat([beat(first), beat(second)])
    assert [r.id for r in replaced] == [first.id]
    # Still in flight (heartbeated) until its worker stops it and reports it.
    running = repeat.client.zscore(repeat.keys("q").running, f"job {first.due_ms}")
    assert running is not None
    assert repeat.report([report_of("revoked", first)]) == 1
    assert repeat.beat([beat(first), beat(second)]) == []  # it left `running`


def test_allow_names_no_run(repeat: Repeat) -> None:
    first, second = two_slots(repeat, "allow")
    assert repeat.started(second)
    assert repeat.beat([beat(first), beat(second)]) == []


def test_a_run_in_flight_beside_the_inflight_one_is_not_named(repeat: Repeat) -> None:
    # Two runs under `allow`, then the policy edited to `replace`: neither was replaced.
    first, second = two_slots(repeat, "allow")
    assert repeat.started(second)
    repeat.register(
        "q", "job", every="1h", template={"task": "t"}, overlap="replace", immediately=True
    )
    assert repeat.beat([beat(first), beat(second)]) == []


def test_a_triggered_run_is_not_named(repeat: Repeat) -> None:
    repeat.register("q", "job", every="1h", template={"task": "t"}, overlap="replace")
    sent = RecordingDispatcher()
    repeat.trigger("q", "job")
    Pump(repeat, ["q"], sent).run_once()
    (triggered,) = sent.clear()
    assert triggered.triggered
    assert repeat.started(triggered)
    assert repeat.beat([beat(triggered)]) == []


def test_report_still_returns_the_count_applied(repeat: Repeat) -> None:
    first, second = two_slots(repeat, "replace")
    assert repeat.report([beat(first), beat(second)]) == 2


def test_a_backfilled_run_is_not_named(repeat: Repeat) -> None:
    # A backfill's run is out of band: never the one a slot replaces (its worker says so).
    first, _ = two_slots(repeat, "replace")
    assert repeat.beat([replace(beat(first), backfill=True)]) == []


def test_the_reporters_heartbeat_keeps_the_backfill_flag() -> None:
    # The Reporter heartbeats a run from its start report: the flag must survive that.
    start = replace(
        report_of("started", {"id": "i", "queue": "q", "name": "n", "due_ms": 1}), backfill=True
    )
    assert _heartbeat(start).backfill
