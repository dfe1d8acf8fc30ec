"""A copy of an occurrence that never reached its task (`Report.task_ran=False`: skipped
before its start, as Dramatiq's `AgeLimit` skips a redelivered copy, or unknown to an old
worker) does not end the same attempt running elsewhere (found by a probe on RabbitMQ).

Before, its `skipped` (or `failed`) ended the running entry: the history read `skipped` for
a run that went on and succeeded, and the registration left flight, so `overlap="skip"` let
the next slot start beside the run; and the worker's reporter stopped heartbeating a run of
the same id in its own process. Real Lua, on the suite's server and on fakeredis.
"""

from __future__ import annotations

import time

from emq_bridge import Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.occurrence import Occurrence
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

TEMPLATE = {"task": "reports.digest"}


def _fired(repeat: Repeat) -> tuple[Occurrence, int]:
    t0 = (repeat.server_time_ms() // 1000) * 1000 - 10_000
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    (occurrence,) = Pump(repeat, ["q"], RecordingDispatcher()).run_once(now_ms=t0 + 1000).dispatched
    return occurrence, t0


def _copy(occurrence: Occurrence, kind: str, at_ms: int) -> Report:
    return Report(
        kind,  # type: ignore[arg-type]
        occurrence.queue,
        occurrence.name,
        occurrence.id,
        occurrence.due_ms,
        at_ms,
        task_ran=False,
    )


def test_a_copy_that_never_ran_leaves_the_running_attempt_alone(any_repeat: Repeat) -> None:
    occurrence, t0 = _fired(any_repeat)
    assert any_repeat.report([report_of("started", occurrence, at_ms=t0 + 1100)]) == 1
    for kind in ("skipped", "failed"):
        assert any_repeat.report([_copy(occurrence, kind, t0 + 1200)]) == 0
    registration = any_repeat.get("q", "job")
    assert registration is not None
    assert (registration.last_status, registration.skipped) == ("running", 0)
    assert registration.inflight is not None  # still guarding the next slots
    assert any_repeat.report([report_of("succeeded", occurrence, at_ms=t0 + 3000)]) == 1
    (entry,) = any_repeat.history("q", "job")
    assert (entry.status, entry.started_ms, entry.finished_ms) == (
        "succeeded",
        t0 + 1100,
        t0 + 3000,
    )


def test_a_copy_that_never_ran_still_ends_an_occurrence_no_worker_started(
    any_repeat: Repeat,
) -> None:
    occurrence, t0 = _fired(any_repeat)
    assert any_repeat.report([_copy(occurrence, "skipped", t0 + 1200)]) == 1
    registration = any_repeat.get("q", "job")
    assert registration is not None
    assert (registration.last_status, registration.skipped) == ("skipped", 1)
    assert registration.inflight is None


def test_the_reporter_keeps_heartbeating_a_run_whose_copy_it_reports_unrun(
    repeat: Repeat,
) -> None:
    occurrence, t0 = _fired(repeat)
    reporter = Reporter(repeat, heartbeat_s=0.2, linger_s=0.0)
    try:
        reporter.report(report_of("started", occurrence))
        reporter.report(_copy(occurrence, "skipped", t0 + 1200))
        assert reporter.flush(5)
        time.sleep(1.0)  # the heartbeat TTL is 0.6 s: only heartbeats keep it in flight
        assert reporter.flush(5)
        deadline = repeat.client.zscore(repeat.keys("q").running, occurrence.lease_member)
        assert deadline is not None and deadline > repeat.server_time_ms()
    finally:
        reporter.close()
    (entry,) = repeat.history("q", "job")
    assert entry.status == "running"
