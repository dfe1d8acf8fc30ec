"""A `started` report waits aside until its run has lasted `linger_s` (`Reporter`).

Before, a start went to the queue at once: a batch the thread sent while a short run ran
carried its start alone, and its end came in the next batch, two registry updates for one
short task. Now a run that ends within `linger_s` always costs one update (its final report
carries the start), a longer run's start is sent on its own once it has lasted that long,
and a flush sends every start still waiting. Real reporter thread, real server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from emq_bridge import Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter

TEMPLATE = {"task": "reports.digest"}


class Sent(Repeat):
    """The registry, keeping every batch the reporter sends to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list[Report]] = []

    def report(self, reports: Sequence[Report], **options: Any) -> int:
        self.batches.append(list(reports))
        return super().report(reports, **options)

    def sent(self, name: str) -> list[tuple[str, int | None]]:
        """(kind, started_ms) of every report of `name` sent, in order."""
        return [(r.kind, r.started_ms) for b in self.batches for r in b if r.name == name]


def _registry(redis_url: str, prefix: str) -> tuple[Sent, int]:
    repeat = Sent(redis.Redis.from_url(redis_url), prefix)
    now = repeat.server_time_ms()
    for name in ("a", "b", "c"):
        repeat.upsert("q", name, every="1h", template=TEMPLATE, now_ms=now - 60_000)
    return repeat, now


def _occurrence(name: str, due_ms: int) -> dict[str, Any]:
    return {"id": f"{name}-{due_ms}", "queue": "q", "name": name, "due_ms": due_ms}


def test_a_run_shorter_than_the_linger_costs_one_update_though_a_batch_left_meanwhile(
    redis_url: str, prefix: str
) -> None:
    repeat, now = _registry(redis_url, prefix)
    reporter = Reporter(repeat, linger_s=0.4)
    other = _occurrence("b", now)
    reporter.report(report_of("started", other, at_ms=now))
    reporter.report(report_of("succeeded", other, at_ms=now + 5))  # wakes the thread: 0.4 s
    time.sleep(0.3)
    short = _occurrence("c", now)
    start = report_of("started", short)
    reporter.report(start)  # 0.1 s before that batch leaves
    time.sleep(0.25)
    assert repeat.sent("b") == [("succeeded", now)]  # that batch left, without c's start
    assert repeat.sent("c") == []
    reporter.report(start.ended("succeeded", start.at_ms + 200))  # c ran 0.2 s < 0.4 s
    assert reporter.flush(5)
    assert repeat.sent("c") == [("succeeded", start.at_ms)]  # one update, with its start
    (entry, *_) = repeat.history("q", "c")
    assert (entry.status, entry.started_ms) == ("succeeded", start.at_ms)
    assert entry.finished_ms == start.at_ms + 200
    reporter.close()
    repeat.close()


def test_a_longer_run_is_seen_running_once_it_lasted_the_linger(
    redis_url: str, prefix: str
) -> None:
    repeat, now = _registry(redis_url, prefix)
    reporter = Reporter(repeat, linger_s=0.2)
    start = report_of("started", _occurrence("a", now))
    reporter.report(start)
    time.sleep(0.1)
    assert repeat.sent("a") == []  # not yet: it may still end within the linger
    deadline = time.monotonic() + 5
    while not repeat.sent("a") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert repeat.sent("a") == [("started", None)]
    assert repeat.history("q", "a")[0].status == "running"
    reporter.report(start.ended("failed", start.at_ms + 900, "OSError: flaky"))
    assert reporter.flush(5)
    assert repeat.sent("a") == [("started", None), ("failed", None)]  # the start not again
    (entry, *_) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms, entry.error) == (
        "failed",
        start.at_ms,
        "OSError: flaky",
    )
    reporter.close()
    repeat.close()


def test_a_flush_sends_the_starts_still_waiting(redis_url: str, prefix: str) -> None:
    repeat, now = _registry(redis_url, prefix)
    reporter = Reporter(repeat, linger_s=5.0)
    reporter.report(report_of("started", _occurrence("a", now)))
    assert reporter.flush(5)  # a worker shutting down: what runs is told, not kept
    assert repeat.history("q", "a")[0].status == "running"
    reporter.close()
    repeat.close()


def test_a_report_of_another_occurrence_sends_a_waiting_start_first(
    redis_url: str, prefix: str
) -> None:
    """Two runs of one registration overlapping in one process: the first start is not
    folded past the second run's reports, so the history keeps the order they started in."""
    repeat, now = _registry(redis_url, prefix)
    reporter = Reporter(repeat, linger_s=5.0)
    first = report_of("started", _occurrence("a", now), at_ms=now + 10)
    second = report_of("started", _occurrence("a", now + 1), at_ms=now + 20)
    reporter.report(first)
    reporter.report(second)
    reporter.finish(second, "succeeded", now + 30)
    reporter.finish(first, "succeeded", now + 40)
    assert reporter.flush(5)
    assert repeat.sent("a") == [
        ("started", None),
        ("succeeded", now + 20),
        ("succeeded", None),
    ]
    history = repeat.history("q", "a")
    assert [e.id for e in history[:2]] == [f"a-{now + 1}", f"a-{now}"]  # newest start first
    assert [e.started_ms for e in history[:2]] == [now + 20, now + 10]
    reporter.close()
    repeat.close()


class _SlowClaims(dict[tuple[str, str], tuple[Report, float]]):
    """The starts waiting aside, the reporter thread paused right after it claims one: the
    window in which a thread switch lets the run's end in (found by a probe reading the code)."""

    def pop(self, *args: Any) -> Any:
        taken = super().pop(*args)
        if taken is not None and threading.current_thread().name == "emq-bridge-reporter":
            time.sleep(0.05)
        return taken


def test_a_run_ending_as_the_thread_claims_its_start_keeps_its_start_and_duration(
    redis_url: str, prefix: str
) -> None:
    repeat, now = _registry(redis_url, prefix)
    reporter = Reporter(repeat, linger_s=0.05)
    reporter._unsent = _SlowClaims()
    start = report_of("started", _occurrence("a", now))
    reporter.report(start)
    time.sleep(0.075)  # its start fell due: the thread claimed it and is paused there
    reporter.finish(start, "succeeded", start.at_ms + 75)
    assert reporter.flush(5)
    assert repeat.sent("a") == [("started", None), ("succeeded", None)]  # in that order
    (entry, *_) = repeat.history("q", "a")
    assert (entry.status, entry.started_ms, entry.duration_ms) == ("succeeded", start.at_ms, 75)
    reporter.close()
    repeat.close()
