"""The same attempt of an occurrence run after a worker skipped it is recorded as what happened;
a second run of an attempt that ended otherwise changes nothing.

A middleware that postpones a message (`SkipMessage`, and the message enqueued again a moment
later) has the same attempt of the same occurrence run after its `skipped` was reported. That
run's reports outranked nothing (a final status ties with a final status), so the history kept
`skipped` while it ran and succeeded (a probe of Dramatiq compositions, session 37). A report
whose run started after a skip's end now replaces it. Only a skip gives way so: a second
delivery of a run that succeeded or failed (at least once: an ack lost with its worker) would
count a failure twice or flip the outcome (the review of that first version), so it changes
nothing, as before.
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


def _registered(repeat: Repeat) -> Repeat:
    repeat.upsert(
        "q", "a", every="1h", template={"task": "t"}, pause_after_failures=2, now_ms=DUE - 1
    )
    return repeat


def test_a_postponed_copy_of_a_skipped_run_is_recorded_when_it_runs(repeat: Repeat) -> None:
    _registered(repeat)
    # Another middleware skipped it before its actor ran (and sent a copy on, delayed).
    assert repeat.report([_report(repeat, "skipped", DUE + 1_000, task_ran=False)]) == 1
    # The copy runs a second later; its start and end come folded into one report.
    assert repeat.report([_report(repeat, "succeeded", DUE + 2_500, DUE + 2_000)]) == 1
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms, entry.finished_ms) == (
        "succeeded",
        DUE + 2_000,
        DUE + 2_500,
    )
    registration = repeat.get("q", "a")
    assert registration is not None and registration.skipped == 1  # counted once, as before
    assert registration.last_success_ms == DUE + 2_500


def test_a_copy_started_after_a_skip_then_a_stale_repeat_of_the_skip(repeat: Repeat) -> None:
    _registered(repeat)
    # Skipped by a middleware after emq-bridge's (its start seen, so `task_ran` stays true).
    skipped = _report(repeat, "skipped", DUE + 1_000)
    assert repeat.report([skipped]) == 1
    assert repeat.report([_report(repeat, "started", DUE + 5_000)]) == 1  # the copy starts
    assert repeat.report([skipped]) == 0  # the skip sent again: from before this run
    assert repeat.report([_report(repeat, "failed", DUE + 6_000, error="E: x")]) == 1
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms) == ("failed", DUE + 5_000)


def test_a_second_run_of_an_attempt_that_ended_changes_nothing(repeat: Repeat) -> None:
    _registered(repeat)
    failed = _report(repeat, "failed", DUE + 2_000, DUE + 1_000, error="ValueError: no")
    assert repeat.report([failed]) == 1
    # Delivered again (at least once) and run again, after the first run ended: once.
    again = _report(repeat, "failed", DUE + 9_000, DUE + 8_000, error="ValueError: no")
    assert repeat.report([again]) == 0
    assert repeat.report([_report(repeat, "succeeded", DUE + 9_500, DUE + 9_000)]) == 0
    assert repeat.report([_report(repeat, "started", DUE + 10_000)]) == 0
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms) == ("failed", DUE + 1_000)
    registration = repeat.get("q", "a")
    assert registration is not None and registration.failures == 1
    assert not registration.paused  # one failed occurrence, under pause_after_failures=2


def test_a_skip_twice_is_counted_once(repeat: Repeat) -> None:
    _registered(repeat)
    assert repeat.report([_report(repeat, "skipped", DUE + 2_000, DUE + 1_000)]) == 1
    # Run again later and skipped again (its start folded in): the entry tells the later
    # run, as its start and its skip sent one by one would (the lifecycle model), and the
    # occurrence is counted skipped once.
    assert repeat.report([_report(repeat, "skipped", DUE + 9_000, DUE + 8_000)]) == 1
    (entry,) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms, entry.finished_ms) == (
        "skipped",
        DUE + 8_000,
        DUE + 9_000,
    )
    registration = repeat.get("q", "a")
    assert registration is not None and registration.skipped == 1


def test_a_skip_its_rerun_and_a_skip_again_one_by_one_count_once(repeat: Repeat) -> None:
    _registered(repeat)
    assert repeat.report([_report(repeat, "skipped", DUE + 2_000, DUE + 1_000)]) == 1
    assert repeat.report([_report(repeat, "started", DUE + 8_000)]) == 1  # a copy runs
    assert repeat.report([_report(repeat, "skipped", DUE + 9_000)]) == 1  # and is skipped
    registration = repeat.get("q", "a")
    assert registration is not None and registration.skipped == 1
