"""A `failed` occurrence whose task never ran (`Report.task_ran=False`) neither counts toward
`pause_after_failures` nor ends a failure streak.

During a rolling deploy an old worker gets the message of a task only the new code defines
(Dramatiq's `ActorNotFound`, Celery's `NotRegistered`) and reports it `failed`. Before, each
such report counted: a schedule with `pause_after_failures=2` that the new version added
paused itself after two slots an old worker took, and stayed paused after the deploy. Now
it is still `failed` in the history and the record (and frees a guarded registration), but
report.lua leaves the streak as it was. Real Lua, on the suite's server and on fakeredis.
"""

from __future__ import annotations

import pytest

from emq_bridge import Pump, Repeat
from emq_bridge.errors import ScheduleError
from emq_bridge.lifecycle import report_of
from emq_bridge.occurrence import Occurrence
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

UNKNOWN = "ActorNotFound: 'renamed_new' is not an actor of this worker"
TEMPLATE = {"task": "reports.digest"}


def _start(repeat: Repeat) -> int:
    """A registration time on a whole second of the server clock, a little in the past."""
    return (repeat.server_time_ms() // 1000) * 1000 - 10_000


def _fire(pump: Pump, now_ms: int) -> list[Occurrence]:
    return pump.run_once(now_ms=now_ms).dispatched


def _unrun(occurrence: Occurrence, at_ms: int) -> Report:
    return Report(
        "failed",
        occurrence.queue,
        occurrence.name,
        occurrence.id,
        occurrence.due_ms,
        at_ms,
        error=UNKNOWN,
        task_ran=False,
    )


def test_a_failure_whose_task_never_ran_neither_counts_nor_clears_the_streak(
    any_repeat: Repeat,
) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert(
        "q", "job", every="1s", template=TEMPLATE, overlap="skip", pause_after_failures=2, now_ms=t0
    )
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    assert any_repeat.finished(first, ok=False, error=ValueError("bad"))
    for k in range(2, 6):  # four slots an old worker took: the streak stays at 1, not paused
        (occurrence,) = _fire(pump, t0 + 1000 * k)  # the one before freed the guarded slot
        assert any_repeat.report([_unrun(occurrence, t0 + 1000 * k + 100)]) == 1
        registration = any_repeat.get("q", "job")
        assert registration is not None
        assert (registration.failures, registration.paused) == (1, False)
        assert registration.parked_reason is None and registration.inflight is None
        assert (registration.last_status, registration.last_error) == ("failed", UNKNOWN)
    entries = any_repeat.history("q", "job")
    assert [e.status for e in entries] == ["failed"] * 5
    assert [e.error for e in entries] == [UNKNOWN] * 4 + ["ValueError: bad"]
    # A task that ran and failed still counts: the second failure of the streak pauses.
    (last,) = _fire(pump, t0 + 6000)
    assert any_repeat.finished(last, ok=False, error="E: again")
    registration = any_repeat.get("q", "job")
    assert registration is not None and (registration.failures, registration.paused) == (2, True)
    assert registration.parked_reason == "paused after 2 consecutive failures; last: E: again"


def test_an_unrun_failure_does_not_end_a_streak_a_success_would(any_repeat: Repeat) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, pause_after_failures=3, now_ms=t0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    for k, outcome in enumerate(["failed", "unrun", "failed", "unrun", "succeeded"], start=1):
        (occurrence,) = _fire(pump, t0 + 1000 * k)
        if outcome == "unrun":
            any_repeat.report([_unrun(occurrence, t0 + 1000 * k + 100)])
        else:
            any_repeat.finished(occurrence, ok=outcome == "succeeded", error="E: x")
        registration = any_repeat.get("q", "job")
        assert registration is not None and not registration.paused
        assert registration.failures == {1: 1, 2: 1, 3: 2, 4: 2, 5: 0}[k]


def test_an_old_reporters_array_without_the_flag_counts(any_repeat: Repeat) -> None:
    # The array a reporter of the previous release sends (12 elements) is what a report of a
    # task that ran still sends: report.lua reads the missing flag as "it ran".
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, pause_after_failures=2, now_ms=t0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    for k in (1, 2):
        (occurrence,) = _fire(pump, t0 + 1000 * k)
        item = report_of("failed", occurrence, at_ms=t0 + 1000 * k + 100, error="E: x")
        array = item.to_json_item()
        assert len(array) == 12 and array[0] == "failed" and array[-1] == ""
        assert any_repeat.report([item]) == 1
    registration = any_repeat.get("q", "job")
    assert registration is not None and (registration.failures, registration.paused) == (2, True)
    unrun = _unrun(occurrence, t0).to_json_item()  # the flag only when the task never ran
    assert len(unrun) == 13 and unrun[-1] == 0 and unrun[:-1][9] == UNKNOWN


def test_the_flag_is_checked_and_carried_by_ended_and_folded(repeat: Repeat) -> None:
    start = Report("started", "q", "job", "id-1", 1_000, 1_100)
    with pytest.raises(ScheduleError, match="task_ran must be True or False"):
        Report("failed", "q", "job", "id-1", 1_000, 1_200, task_ran=0)  # type: ignore[arg-type]
    for kind in ("started", "succeeded", "retrying", "revoked", "heartbeat"):
        with pytest.raises(ScheduleError, match="task_ran=False is for a failed or skipped report"):
            Report(kind, "q", "job", "id-1", 1_000, 1_200, task_ran=False)  # type: ignore[arg-type]
    unrun = Report("failed", "q", "job", "id-1", 1_000, 1_200, error=UNKNOWN, task_ran=False)
    assert unrun.folded(start).task_ran is False and unrun.folded(start).started_ms == 1_100
    assert start.ended("failed", 1_200).task_ran is True

    # Through a worker's Reporter: a start of the occurrence waiting aside is a run of it in
    # this process, so the unrun report is another copy's (session 25): the start is sent
    # first, not folded, and the copy that never ran leaves the run as it is (no streak).
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, pause_after_failures=1, now_ms=t0)
    (occurrence,) = _fire(Pump(repeat, ["q"], RecordingDispatcher()), t0 + 1000)
    reporter = Reporter(repeat, heartbeat_s=0.2)
    try:
        reporter.report(report_of("started", occurrence, at_ms=t0 + 1100))
        reporter.report(_unrun(occurrence, t0 + 1200))
        assert reporter.flush(5)
    finally:
        reporter.close()
    registration = repeat.get("q", "job")
    assert registration is not None and (registration.failures, registration.paused) == (0, False)
    (entry,) = repeat.history("q", "job")
    assert (entry.status, entry.error, entry.started_ms) == ("running", None, t0 + 1100)
