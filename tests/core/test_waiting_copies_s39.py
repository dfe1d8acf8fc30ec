"""A `waiting` report: the heartbeat of a guarded occurrence a worker holds received and not
started. It keeps the occurrence in flight for the heartbeat TTL (so one held by a worker
killed with it is lost after the TTL, not at the start timeout), but never a run of its
attempt that began: a copy waiting while its run runs, or ran on a worker since killed,
elsewhere must not keep that run in flight (session 38's review of a first Dramatiq version,
reverted, showed a dead run kept in flight for ever by such a copy). A worker that stops hands
what it held back to its broker: in flight the start timeout from then (`hold_ms`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from emq_bridge import Occurrence, Pump, Repeat, ScheduleError
from emq_bridge.lifecycle import START_TIMEOUT_MS, report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

TTL_MS = 3_000


def sent_slot(repeat: Repeat, name: str = "job") -> Occurrence:
    repeat.register("q", name, every="1h", template={"task": "t"}, overlap="skip", immediately=True)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    (occurrence,) = sent.clear()
    return occurrence


def deadline_in_ms(repeat: Repeat, occurrence: Occurrence) -> float | None:
    """How far the occurrence's lost deadline lies from the server's now, or None."""
    score = repeat.client.zscore(repeat.keys("q").running, f"{occurrence.name} {occurrence.due_ms}")
    if score is None:
        return None
    seconds, micros = repeat.client.time()
    return float(score) - (seconds * 1000 + micros // 1000)


def waiting(occurrence: Occurrence, attempt: int = 1, hold_ms: int = 0) -> Report:
    return report_of("waiting", occurrence, attempt=attempt).ended(
        "waiting", report_of("waiting", occurrence).at_ms, hold_ms=hold_ms
    )


def test_a_copy_held_unstarted_is_kept_in_flight_for_the_ttl_not_the_start_timeout(
    repeat: Repeat,
) -> None:
    occurrence = sent_slot(repeat)
    start_timeout = deadline_in_ms(repeat, occurrence)
    assert start_timeout is not None and start_timeout > START_TIMEOUT_MS - 5_000
    assert repeat.report([waiting(occurrence)], heartbeat_ttl_ms=TTL_MS) == 1
    left = deadline_in_ms(repeat, occurrence)
    assert left is not None and 0 < left <= TTL_MS
    # Its worker killed: no more heartbeats, so a pump marks it lost once the TTL passed.
    repeat.client.zadd(repeat.keys("q").running, {f"{occurrence.name} {occurrence.due_ms}": 0})
    assert [m[2] for m in repeat.mark_lost("q", [f"{occurrence.name} {occurrence.due_ms}"])] == [
        occurrence.id
    ]
    (entry,) = repeat.history("q", "job")
    assert entry.status == "lost"


@pytest.mark.parametrize("reported", [False, True], ids=["begun-mark", "start-reported"])
def test_a_copy_waiting_while_its_attempt_runs_elsewhere_keeps_nothing_in_flight(
    repeat: Repeat, reported: bool
) -> None:
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence, heartbeat_ttl_ms=TTL_MS)  # another worker runs it
    if reported:
        assert repeat.started(occurrence, heartbeat_ttl_ms=TTL_MS)
    before = deadline_in_ms(repeat, occurrence)
    assert before is not None and before <= TTL_MS
    # A copy waiting in a live worker's queue, heartbeated with a long TTL: ignored.
    assert repeat.report([waiting(occurrence)], heartbeat_ttl_ms=START_TIMEOUT_MS) == 0
    assert repeat.report([waiting(occurrence, hold_ms=START_TIMEOUT_MS)]) == 0
    after = deadline_in_ms(repeat, occurrence)
    assert after is not None and after <= before


def test_a_retry_waiting_for_its_backoff_is_kept_in_flight_until_it_begins(
    repeat: Repeat,
) -> None:
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence)
    assert (
        repeat.report(
            [
                report_of("retrying", occurrence, attempt=1).ended(
                    "retrying", report_of("retrying", occurrence).at_ms, hold_ms=60_000
                )
            ]
        )
        == 1
    )
    # Attempt 2 waits in a worker's delay queue: its waiting heartbeat applies (attempt 1's
    # run ended; the retry has not begun) ...
    assert repeat.report([waiting(occurrence, attempt=2)], heartbeat_ttl_ms=TTL_MS) == 1
    left = deadline_in_ms(repeat, occurrence)
    assert left is not None and left <= TTL_MS
    # ... and a copy of attempt 1 (a duplicate of the run that failed) does not.
    assert repeat.report([waiting(occurrence, attempt=1)], heartbeat_ttl_ms=60_000) == 0
    # Once attempt 2 began, its waiting copies keep nothing in flight.
    assert repeat.begin(report_of("started", occurrence, attempt=2), heartbeat_ttl_ms=TTL_MS)
    assert repeat.report([waiting(occurrence, attempt=2)], heartbeat_ttl_ms=60_000) == 0


def test_a_handed_back_copy_stays_in_flight_for_the_hold(repeat: Repeat) -> None:
    occurrence = sent_slot(repeat)
    assert repeat.report([waiting(occurrence)], heartbeat_ttl_ms=TTL_MS) == 1
    assert repeat.report([waiting(occurrence, hold_ms=START_TIMEOUT_MS)]) == 1
    left = deadline_in_ms(repeat, occurrence)
    assert left is not None and left > START_TIMEOUT_MS - 5_000


def test_a_waiting_report_of_an_occurrence_not_in_flight_changes_nothing(
    repeat: Repeat,
) -> None:
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence) and repeat.started(occurrence)
    assert repeat.finished(occurrence, ok=True)
    assert repeat.report([waiting(occurrence)]) == 0
    assert deadline_in_ms(repeat, occurrence) is None
    (entry,) = repeat.history("q", "job")
    assert entry.status == "succeeded"
    # An unguarded occurrence is never in flight: nothing to keep.
    repeat.register("q", "free", every="1h", template={"task": "t"}, immediately=True)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    (free,) = [o for o in sent.clear() if o.name == "free"]
    assert repeat.report([waiting(free)]) == 0
    assert repeat.history("q", "free") == []


@contextmanager
def reporting_to(repeat: Repeat) -> Iterator[Reporter]:
    """A reporter sending to `repeat`, heartbeating every second; closed after."""
    reporter = Reporter(lambda: repeat, heartbeat_s=1.0)
    try:
        yield reporter
    finally:
        reporter.close(5.0)


def test_a_reporter_hands_back_what_its_watch_lists_waiting_and_beats_it_no_more(
    repeat: Repeat,
) -> None:
    occurrence = sent_slot(repeat)
    held = waiting(occurrence)
    with reporting_to(repeat) as reporter:
        reporter.watch(lambda: [held])
        reporter.hand_back(START_TIMEOUT_MS)
        assert reporter.flush(5.0)
        left = deadline_in_ms(repeat, occurrence)
        assert left is not None and left > START_TIMEOUT_MS - 5_000
        reporter._beat_watched()  # a heartbeat after the hand-back: the copy is not beaten
        left = deadline_in_ms(repeat, occurrence)
        assert left is not None and left > START_TIMEOUT_MS - 5_000


def test_a_waiting_report_with_a_bad_hold_is_refused() -> None:
    with pytest.raises(ScheduleError):
        Report("waiting", "q", "job", "an-id", 1, 1, hold_ms=-1)


def test_a_reporter_watching_again_heartbeats_what_its_new_worker_holds(
    repeat: Repeat,
) -> None:
    # The session's review: once a worker stopped, a later worker of the same process (a
    # test's `Worker` per test) had its waiting messages handed back at every heartbeat's
    # place, never heartbeated, so kept the start timeout.
    occurrence = sent_slot(repeat)
    held = waiting(occurrence)
    with reporting_to(repeat) as reporter:
        reporter.watch(lambda: [])
        reporter.hand_back(START_TIMEOUT_MS)
        reporter.watch(lambda: [held])  # the next worker
        reporter._beat_watched()
        left = deadline_in_ms(repeat, occurrence)
        assert left is not None and left <= reporter.heartbeat_ttl_ms


def test_a_waiting_retry_keeps_its_eta_plus_the_start_timeout(repeat: Repeat) -> None:
    # The review: a retry waiting out an hour's backoff in a worker's delay queue was
    # heartbeated down to the TTL, so lost seconds after its worker was killed, while its
    # broker still held the message (given back minutes later, then skipped: never run).
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence)
    start = report_of("started", occurrence)
    assert repeat.report([start.ended("retrying", start.at_ms, "E", hold_ms=3_600_000)]) == 1
    retry = report_of("waiting", occurrence, attempt=2)
    assert (
        repeat.report([retry.ended("waiting", retry.at_ms, hold_ms=3_600_000 + START_TIMEOUT_MS)])
        == 1
    )
    left = deadline_in_ms(repeat, occurrence)
    assert left is not None and left > 3_600_000 + START_TIMEOUT_MS - 5_000


def test_a_run_lost_before_its_start_report_is_lost_at_the_attempt_that_began(
    repeat: Repeat,
) -> None:
    # The review: attempt 2 began (begin.lua's mark) and its worker died before its start
    # report left; marked lost at attempt 1, a copy of attempt 2 skipped later read as a
    # later attempt, and turned the loss into a skip.
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence)
    start = report_of("started", occurrence)
    assert repeat.report([start.ended("retrying", start.at_ms, "E", hold_ms=0)]) == 1
    assert repeat.begin(report_of("started", occurrence, attempt=2))  # no start report
    member = f"{occurrence.name} {occurrence.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    assert [m[2] for m in repeat.mark_lost("q", [member])] == [occurrence.id]
    (entry,) = repeat.history("q", "job")
    assert (entry.status, entry.attempt) == ("lost", 2)
    # Attempt 2's start, end and error are not known: not attempt 1's (the second review).
    assert (entry.started_ms, entry.finished_ms, entry.error) == (None, None, None)
    assert repeat.report([report_of("skipped", occurrence, attempt=2)]) == 0
    (entry,) = repeat.history("q", "job")
    assert (entry.status, entry.attempt) == ("lost", 2)
    registration = repeat.get("q", "job")
    assert registration is not None and registration.lost == 1
