"""`Repeat.beat`: a heartbeat tells its worker when a `replace` took its run over.

A Celery worker that misses the revoke a `replace` sends (one in warm shutdown, one with
remote control off) ran the replaced run on beside its replacement. The claim now keeps the
runs it replaced in the record (`replaced_runs`, the newest 16), and `report.lua` names, in
its reply, the heartbeats of those still running. Only those: a first version inferred them
(a run neither `inflight` nor in `inflight_also`), and the review of it (session 40) had a
worker kill runs nothing replaced, past `inflight_also`'s cap of 16.
"""

from __future__ import annotations

from dataclasses import replace

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import _heartbeat
from emq_bridge.testing import RecordingDispatcher

HOUR_MS = 3_600_000


def first_slot(repeat: Repeat, overlap: str) -> tuple[Pump, RecordingDispatcher, Occurrence]:
    """Register "job" (every hour, `overlap`) and send its first slot, not started."""
    repeat.register(
        "q", "job", every="1h", template={"task": "t"}, overlap=overlap, immediately=True
    )
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    pump.run_once()
    (first,) = sent.clear()
    return pump, sent, first


def two_slots(repeat: Repeat, overlap: str) -> tuple[Occurrence, Occurrence]:
    """Send a slot, start it, and send the next one while it runs."""
    pump, sent, first = first_slot(repeat, overlap)
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
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, overlap="replace")
    edited = repeat.get("q", "job")
    assert edited is not None and edited.definition.overlap == "replace"
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


def test_the_reporters_heartbeat_keeps_the_backfill_flag() -> None:
    # The Reporter heartbeats a run from its start report: a backfill's stays out of band.
    start = replace(
        report_of("started", {"id": "i", "queue": "q", "name": "n", "due_ms": 1}), backfill=True
    )
    assert _heartbeat(start).backfill


def test_runs_past_the_cap_of_those_in_flight_beside_are_not_named(repeat: Repeat) -> None:
    # 20 runs under `allow` (only 16 are kept beside the `inflight` one), then the policy
    # edited to `replace`: no claim replaced any of them.
    repeat.register("q", "job", every="1h", template={"task": "t"}, immediately=True)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    pump.run_once()
    runs = sent.clear()
    for n in range(1, 20):
        pump.run_once(now_ms=runs[0].due_ms + n * HOUR_MS + 1)
        runs += sent.clear()
    for run in runs:
        assert repeat.started(run)
    assert len(runs) == 20
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, overlap="replace")
    edited = repeat.get("q", "job")
    assert edited is not None and edited.definition.overlap == "replace"
    assert repeat.beat([beat(run) for run in runs]) == []
    # The next slot replaces every run in flight the record tracks (its `inflight` one and
    # the 16 beside it): those only are named, not the 3 oldest, forgotten past the cap.
    pump.run_once(now_ms=runs[0].due_ms + 20 * HOUR_MS + 1)
    (newest,) = sent.clear()
    named = {r.id for r in repeat.beat([beat(run) for run in runs] + [beat(newest)])}
    assert len(named) == 17 and newest.id not in named
    assert not named & {run.id for run in runs[1:4]}


def test_a_run_replaced_before_it_started_is_named_once_it_runs(repeat: Repeat) -> None:
    pump, sent, first = first_slot(repeat, "replace")
    pump.run_once(now_ms=first.due_ms + HOUR_MS + 1)  # replaces it while it waits unstarted
    (second,) = sent.clear()
    assert repeat.started(second)
    assert repeat.started(first)  # its worker never got the revoke: it starts late
    assert [r.id for r in repeat.beat([beat(first), beat(second)])] == [first.id]


def test_a_trigger_the_claim_replaced_is_named_as_the_pump_revoked_it(repeat: Repeat) -> None:
    repeat.register("q", "job", every="1h", template={"task": "t"}, overlap="replace")
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    repeat.trigger("q", "job")
    pump.run_once()
    (triggered,) = sent.clear()
    assert repeat.started(triggered)  # in flight: the `inflight` one
    due = repeat.get("q", "job")
    assert due is not None and due.next_run_ms is not None
    pump.run_once(now_ms=due.next_run_ms + 1)  # the slot replaces it (the pump revokes it)
    (slot,) = sent.clear()
    assert [r.id for r in repeat.beat([beat(triggered), beat(slot)])] == [triggered.id]


def test_a_slot_replaces_a_trigger_running_beside_it_and_runs(repeat: Repeat) -> None:
    # The review of session 40: a trigger in flight beside the slot `inflight` (its
    # `inflight_also`) made every later slot of a `replace` schedule refused at its start
    # (begin.lua saw the trigger), while each slot replaced only the slot before it.
    first, _ = two_slots(repeat, "replace")  # `first` is replaced and named already
    repeat.trigger("q", "job")
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    pump.run_once(now_ms=first.due_ms + HOUR_MS + 2)
    (triggered,) = sent.clear()
    assert repeat.started(triggered)  # beside the slot in flight
    pump.run_once(now_ms=first.due_ms + 2 * HOUR_MS + 1)
    (third,) = sent.clear()
    named = {r.id for r in repeat.beat([beat(triggered), beat(third)])}
    assert triggered.id in named and third.id not in named
    # Its worker may start it: nothing it does not replace is in its way.
    assert repeat.begin(third)


def test_a_run_is_replaced_once(repeat: Repeat) -> None:
    # One a framework cannot revoke (Dramatiq) runs on: the next slot does not replace it
    # again (one `replaces` event per run), and the slot after may start.
    first, second = two_slots(repeat, "replace")
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    tick = pump.run_once(now_ms=first.due_ms + 2 * HOUR_MS + 1)
    assert len(tick.dispatched) == 1
    claim_pairs = repeat.client.hget(repeat.keys("q").record("job"), "replaced_runs")
    assert claim_pairs is not None
    members = claim_pairs.decode().split("\n")
    assert members.count(f"job {first.due_ms}") == 1
    assert f"job {second.due_ms}" in members


def test_a_replaced_run_still_in_flight_holds_a_schedule_edited_to_skip(repeat: Repeat) -> None:
    # The second review of session 40: a run a `replace` took over that runs on (Dramatiq
    # cannot revoke) was in nobody's way once the policy was edited to `skip`.
    first, second = two_slots(repeat, "replace")
    assert repeat.started(second)
    assert repeat.report([report_of("succeeded", second)]) == 1
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, overlap="skip")
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once(now_ms=first.due_ms + 2 * HOUR_MS + 1)
    (third,) = sent.clear()
    assert repeat.begin_verdict(report_of("started", third)) == "skip"  # `first` runs on
    assert repeat.report([report_of("succeeded", first)]) == 1
    assert repeat.begin_verdict(report_of("started", third)) == "run"


def test_a_trigger_started_after_the_slot_was_sent_holds_it_until_the_next_slot(
    repeat: Repeat,
) -> None:
    # lifecycle.md's overlap table: the slot is skipped at its start; the next replaces it.
    pump, sent, slot = first_slot(repeat, "replace")
    repeat.trigger("q", "job")
    pump.run_once()
    (triggered,) = sent.clear()
    assert repeat.started(triggered)
    assert repeat.begin_verdict(report_of("started", slot)) == "skip"
    pump.run_once(now_ms=slot.due_ms + HOUR_MS + 1)
    (following,) = sent.clear()
    assert triggered.id in {r.id for r in repeat.beat([beat(triggered), beat(following)])}
    assert repeat.begin_verdict(report_of("started", following)) == "run"
