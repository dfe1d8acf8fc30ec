"""A guarded occurrence's copy delivered after its run ended (a send that outlasted its lease,
an ack lost with its worker) is refused by the worker's start check, and nothing holds the
registration in flight.

Before, `begin.lua` marked such a copy in flight; its reports then outranked nothing in the
history (its attempt had ended), so nothing took it out of `running`: the next slots were
skipped as overlapping until the pump marked the finished occurrence `lost`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher

TEMPLATE = {"task": "t"}
HOUR_MS = 3_600_000


def first_slot(repeat: Repeat, name: str = "job") -> tuple[Occurrence, Pump, RecordingDispatcher]:
    repeat.register("q", name, every="1h", template=TEMPLATE, overlap="skip", immediately=True)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    pump.run_once()
    (occurrence,) = sent.clear()
    return occurrence, pump, sent


@pytest.mark.parametrize("ok", [True, False], ids=["succeeded", "failed"])
def test_a_copy_of_an_ended_occurrence_is_refused_and_holds_nothing(
    repeat: Repeat, ok: bool
) -> None:
    occurrence, pump, sent = first_slot(repeat)
    assert repeat.begin(occurrence)
    assert repeat.started(occurrence)
    assert repeat.finished(occurrence, ok=ok, error=None if ok else ValueError("no"))
    running = repeat.keys("q").running
    assert repeat.client.zcard(running) == 0

    assert not repeat.begin(occurrence)  # the copy: skipped, not run
    assert not repeat.begin(occurrence, mark=False)  # a Celery worker's check on receipt
    assert repeat.client.zcard(running) == 0
    assert not repeat.started(occurrence)  # its reports change nothing, as before
    (entry,) = repeat.history("q", "job")
    assert entry.status == ("succeeded" if ok else "failed")

    # The next slot is sent and runs: nothing holds the registration.
    pump.run_once(occurrence.due_ms + HOUR_MS)
    (following,) = sent.clear()
    assert following.due_ms > occurrence.due_ms
    assert repeat.begin(following)


def test_a_later_attempt_and_a_copy_of_a_lost_occurrence_still_run(repeat: Repeat) -> None:
    occurrence, _, _ = first_slot(repeat)
    assert repeat.begin(occurrence)
    assert repeat.report([report_of("retrying", occurrence, attempt=1)]) == 1
    assert repeat.begin(report_of("started", occurrence, attempt=2))  # the retry's run

    other, _, _ = first_slot(repeat, "other")
    assert repeat.begin(other)
    member = f"{other.name} {other.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})  # its deadline passed
    assert [m[2] for m in repeat.mark_lost("q", [member])] == [other.id]
    assert repeat.begin(other)  # delivered again after it was marked lost: it runs


@pytest.mark.parametrize("kind", ["skipped", "revoked"])
def test_a_refused_copy_of_a_lost_occurrence_leaves_it_lost(repeat: Repeat, kind: str) -> None:
    # A Celery worker revokes such a copy on receipt; before, `revoked` outranked `lost` and
    # took the lost run's start as its own (a "duration" up to the refusal).
    occurrence, _, _ = first_slot(repeat)
    assert repeat.begin(occurrence) and repeat.started(occurrence)
    member = f"{occurrence.name} {occurrence.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    assert [m[2] for m in repeat.mark_lost("q", [member])] == [occurrence.id]
    assert repeat.report([report_of(kind, occurrence)]) == 0  # type: ignore[arg-type]
    (entry,) = repeat.history("q", "job")
    assert entry.status == "lost" and entry.finished_ms is None
    registration = repeat.get("q", "job")
    assert registration is not None and registration.last_status == "lost"


def test_a_copy_delivered_while_its_attempt_runs_heartbeated_is_a_copy_not_a_second_run(
    repeat: Repeat,
) -> None:
    # A Celery Redis transport redelivers an unacked acks_late task once its visibility
    # timeout passes, while the first copy still runs: before, the copy ran beside it (a
    # `skip` schedule's slot ran twice at once) and moved the history entry's start.
    occurrence, _, _ = first_slot(repeat)
    assert repeat.begin_verdict(occurrence) == "run"
    assert repeat.started(occurrence)
    assert repeat.begin_verdict(occurrence, mark=False) == "running"  # a Celery worker's check
    assert repeat.begin_verdict(occurrence) == "running"  # a Dramatiq worker's, at its start
    assert not repeat.begin(occurrence)
    (entry,) = repeat.history("q", "job")
    assert (entry.status, entry.attempt) == ("running", 1)

    # Its worker heard of no more (killed): once its heartbeats lapse, the copy may run.
    member = f"{occurrence.name} {occurrence.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    assert repeat.begin_verdict(occurrence) == "run"


def test_the_verdict_tells_another_occurrence_in_flight_from_a_copy(repeat: Repeat) -> None:
    occurrence, _, _ = first_slot(repeat)
    assert repeat.begin(occurrence) and repeat.started(occurrence)
    # A later slot delivered while this one runs (a message the claim could not see).
    later = report_of(
        "started", replace(occurrence, due_ms=occurrence.due_ms + HOUR_MS, id="the-next-one")
    )
    assert repeat.begin_verdict(later, mark=False) == "skip"
    assert repeat.finished(occurrence, ok=True)
    assert repeat.begin_verdict(occurrence) == "copy"  # it ended: a copy still


def test_a_copy_of_a_skipped_occurrence_is_refused_and_holds_nothing(repeat: Repeat) -> None:
    # Session 34 (a probe of moving the registry): `begin` let a copy of an occurrence a worker
    # had skipped run, marked in flight; its started and succeeded reports then changed
    # nothing (`skipped` outranks them), so the registration was held until the pump marked
    # the run lost, though it had succeeded.
    occurrence, pump, sent = first_slot(repeat)
    assert repeat.report([report_of("skipped", occurrence)]) == 1  # the worker skipped it
    running = repeat.keys("q").running
    assert not repeat.begin(occurrence)  # delivered again: refused, nothing marked
    assert repeat.client.zcard(running) == 0
    (entry,) = repeat.history("q", "job")
    assert entry.status == "skipped"
    pump.run_once(occurrence.due_ms + HOUR_MS)
    (following,) = sent.clear()
    assert repeat.begin(following)  # the next slot is not held by it
