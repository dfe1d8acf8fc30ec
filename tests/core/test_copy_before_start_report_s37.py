"""A copy of a guarded occurrence whose run started but has not reported its start yet is
known as a copy of a run in flight.

A worker marks the run it starts in flight (`begin`, marking); its `started` report follows
from the reporter's thread within the reporter's linger. A copy delivered in between (its
process killed at once, `acks_late` with `reject_on_worker_lost` requeueing the message; the
same message delivered twice) found no history entry, so `begin.lua` took it for the first
copy and let it run: unheld, and a Celery copy's re-sends never counted, so a task that kills
its process at once ran for ever (a probe of Celery's canvas and requeues, session 37). The
marking `begin` now records which run it started (`inflight_run`), and a copy of that run,
while it is live, is `"running"`, as one whose start report landed.
"""

from __future__ import annotations

from dataclasses import replace

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher


def first_slot(repeat: Repeat) -> tuple[Occurrence, str]:
    repeat.register("q", "job", every="1h", template={"t": 1}, overlap="skip", immediately=True)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    (occurrence,) = sent.clear()
    return occurrence, f"{occurrence.name} {occurrence.due_ms}"


def test_a_copy_of_a_run_started_before_its_start_report_is_a_copy_of_a_running_one(
    repeat: Repeat,
) -> None:
    occurrence, member = first_slot(repeat)
    # Fired, the slot is in flight (the claim's mark): its first copy still runs.
    assert repeat.begin_verdict(occurrence, mark=False) == "run"
    assert repeat.begin_verdict(occurrence) == "run"  # a worker starts it; no report yet
    assert repeat.history("q", "job") == []

    assert repeat.begin_verdict(occurrence, mark=False) == "running"  # on receipt (Celery)
    assert repeat.begin_verdict(occurrence) == "running"  # at start (Dramatiq)
    # Its retry is no copy: the next attempt of the run in flight.
    assert repeat.begin_verdict(report_of("started", occurrence, attempt=2), mark=False) == "run"
    # Nor is another occurrence's copy: another slot of the registration is refused as ever.
    later = replace(occurrence, due_ms=occurrence.due_ms + 3_600_000, id="other")
    assert repeat.begin_verdict(later, mark=False) == "skip"

    # Once the run's heartbeats lapse (its process was killed), the copy runs.
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    assert repeat.begin_verdict(occurrence, mark=False) == "run"


def test_the_report_ending_the_run_removes_its_mark(repeat: Repeat) -> None:
    occurrence, _ = first_slot(repeat)
    record = repeat.keys("q").record("job")
    assert repeat.begin(occurrence)
    assert repeat.client.hget(record, "inflight_run") == f"{occurrence.id} 1".encode()
    assert repeat.started(occurrence) and repeat.finished(occurrence, ok=True)
    assert repeat.client.hmget(record, "inflight", "inflight_run") == [None, None]
    assert repeat.begin_verdict(occurrence, mark=False) == "copy"  # it ended: a copy is dropped
