"""A retry revoked while it waits for its countdown (`celery control revoke` of the retry's
id: Celery discards it, unrun, when its eta comes). Found by session 39's Celery probe:

* its `revoked` report (attempt 2, no start of its own) kept attempt 1's start, so the
  history showed the countdown as the run's duration ("took 45.0 s");
* marked `lost` meanwhile (its worker stopped heartbeating it once revoked), the `revoked`
  report was refused as a copy of a lost occurrence: it stayed `lost`.
"""

from __future__ import annotations

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher


def sent_slot(repeat: Repeat) -> Occurrence:
    repeat.register(
        "q", "job", every="1h", template={"task": "t"}, overlap="skip", immediately=True
    )
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    (occurrence,) = sent.clear()
    return occurrence


def retried(repeat: Repeat, occurrence: Occurrence) -> int:
    start = report_of("started", occurrence)
    assert repeat.report([start]) == 1
    retry = start.ended("retrying", start.at_ms + 13, "ValueError: boom", hold_ms=45_000)
    assert repeat.report([retry]) == 1
    return start.at_ms


def test_a_retry_revoked_before_it_started_has_no_start_nor_duration(repeat: Repeat) -> None:
    occurrence = sent_slot(repeat)
    first_start = retried(repeat, occurrence)
    revoked = report_of("revoked", occurrence, attempt=2)
    assert repeat.report([revoked]) == 1
    (entry,) = repeat.history("q", "job")
    assert (entry.status, entry.attempt) == ("revoked", 2)
    assert entry.started_ms is None and entry.duration_ms is None
    assert entry.finished_ms is not None and entry.finished_ms >= first_start
    registration = repeat.get("q", "job")
    assert registration is not None and registration.inflight is None
    assert registration.last_duration_ms is None


def test_a_retry_marked_lost_then_revoked_says_revoked(repeat: Repeat) -> None:
    occurrence = sent_slot(repeat)
    retried(repeat, occurrence)
    member = f"{occurrence.name} {occurrence.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    assert [m[2] for m in repeat.mark_lost("q", [member])] == [occurrence.id]
    registration = repeat.get("q", "job")
    assert registration is not None and registration.lost == 1
    assert repeat.report([report_of("revoked", occurrence, attempt=2)]) == 1
    (entry,) = repeat.history("q", "job")
    assert (entry.status, entry.attempt, entry.started_ms) == ("revoked", 2, None)
    registration = repeat.get("q", "job")
    assert registration is not None and registration.lost == 0


def test_a_copy_of_a_lost_attempt_revoked_on_receipt_still_leaves_it_lost(repeat: Repeat) -> None:
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence) and repeat.started(occurrence)
    member = f"{occurrence.name} {occurrence.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    assert [m[2] for m in repeat.mark_lost("q", [member])] == [occurrence.id]
    assert repeat.report([report_of("revoked", occurrence, attempt=1)]) == 0
    (entry,) = repeat.history("q", "job")
    assert entry.status == "lost"
