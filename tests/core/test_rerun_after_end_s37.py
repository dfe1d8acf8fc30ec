"""The same attempt of an occurrence run again after it ended is recorded as what happened.

A message re-enqueued by hand from a dead-letter queue, or by a middleware that postpones it
(`broker.enqueue(message.copy(...))` and `SkipMessage`), runs the same occurrence at the same
attempt again. Its reports outranked nothing (a final status ties with a final status), so
the history kept the first run's `failed` (or `skipped`) while the run that came after
succeeded, the failure streak was not cleared and `last_success` did not move (a probe of
Dramatiq compositions, session 37). A report whose run started after the entry's end now
replaces it; a repeated report of the first run still changes nothing.
"""

from __future__ import annotations

from emq_bridge import Repeat, Report, occurrence_id
from emq_bridge.outcome import ReportKind

DUE = 1_800_000_000_000


def _report(
    repeat: Repeat,
    kind: ReportKind,
    at_ms: int,
    started_ms: int | None = None,
    *,
    error: str = "",
    task_ran: bool = True,
) -> Report:
    ident = occurrence_id(repeat.prefix, "q", "a", DUE)
    return Report(
        kind, "q", "a", ident, DUE, at_ms, started_ms=started_ms, error=error, task_ran=task_ran
    )


def test_a_run_after_the_attempt_ended_replaces_its_outcome(repeat: Repeat) -> None:
    repeat.upsert("q", "a", every="1h", template={"task": "t"}, now_ms=DUE - 1)
    failed = _report(repeat, "failed", DUE + 2_000, DUE + 1_000, error="ValueError: no")
    assert repeat.report([failed]) == 1
    assert repeat.report([failed]) == 0  # repeated: nothing changes
    registration = repeat.get("q", "a")
    assert registration is not None and registration.failures == 1

    # A report of the first run that comes late (its start before that end) changes nothing.
    assert repeat.report([_report(repeat, "succeeded", DUE + 2_500, DUE + 1_000)]) == 0

    # Sent again from the dead-letter queue: it starts after that end, and succeeds.
    assert repeat.report([_report(repeat, "started", DUE + 60_000)]) == 1
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms, entry.finished_ms) == ("running", DUE + 60_000, None)
    assert repeat.report([_report(repeat, "succeeded", DUE + 61_000, DUE + 60_000)]) == 1
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.attempt, entry.started_ms) == ("succeeded", 1, DUE + 60_000)
    registration = repeat.get("q", "a")
    assert registration is not None
    assert registration.failures == 0 and registration.last_status == "succeeded"
    assert registration.last_success_ms == DUE + 61_000


def test_a_postponed_copy_of_a_skipped_run_is_recorded_when_it_runs(repeat: Repeat) -> None:
    repeat.upsert("q", "a", every="1h", template={"task": "t"}, now_ms=DUE - 1)
    # Another middleware skipped it before its actor ran (and sent a copy on, delayed).
    skipped = _report(repeat, "skipped", DUE + 1_000, task_ran=False)
    assert repeat.report([skipped]) == 1
    # The copy runs a second later; its start and end come folded into one report.
    assert repeat.report([_report(repeat, "succeeded", DUE + 2_500, DUE + 2_000)]) == 1
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms, entry.finished_ms) == (
        "succeeded",
        DUE + 2_000,
        DUE + 2_500,
    )
