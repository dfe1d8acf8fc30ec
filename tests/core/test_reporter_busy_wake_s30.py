"""A busy `Reporter`'s thread gathers its batches on the clock: reports do not wake it.

Before, the thread went idle after every batch it sent, and the next report (a task's
start) woke it with `Event.set`: a futex wake and the GIL handed over, paid by a task's
thread once per batch, about 400 times per 5,000 tasks of a Celery pool process (the
lifecycle bench). While reports keep coming, the thread now waits one linger on the clock
between batches, so a task's report never wakes it; it goes idle again (woken by the next
report) once a linger gathered nothing. Real reporter thread, real server.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from emq_bridge import Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.reporting import Reporter

TEMPLATE = {"task": "reports.digest"}


class Batches(Repeat):
    """The registry, counting the reporter's calls."""

    calls = 0

    def report(self, reports: Any, **options: Any) -> int:
        self.calls += 1
        return super().report(reports, **options)


class CountedEvent(threading.Event):
    """The reporter's wake event, counting the sets made from a thread other than its own."""

    def __init__(self) -> None:
        super().__init__()
        self.sets_from_tasks = 0
        self.reporter_thread: threading.Thread | None = None

    def set(self) -> None:
        if threading.current_thread() is not self.reporter_thread:
            self.sets_from_tasks += 1
        super().set()


def _run_tasks(reporter: Reporter, repeat: Repeat, seconds: float, now: int) -> int:
    """Report a start and a success every ~2 ms for `seconds`, as a busy worker does."""
    tasks, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        occurrence: dict[str, Any] = {
            "id": f"t{tasks}",
            "queue": "q",
            "name": f"s{tasks % 20}",
            "due_ms": now + tasks,
        }
        reporter.report(report_of("started", occurrence))
        reporter.report(report_of("succeeded", occurrence))
        tasks += 1
        time.sleep(0.002)
    return tasks


def test_reports_of_a_busy_worker_do_not_wake_the_reporter_thread(
    redis_url: str, prefix: str
) -> None:
    repeat = Batches(redis.Redis.from_url(redis_url), prefix)
    now = repeat.server_time_ms()
    for i in range(20):
        repeat.upsert("q", f"s{i}", every="1h", template=TEMPLATE, now_ms=now - 60_000)
    reporter = Reporter(repeat, linger_s=0.05)
    wake = CountedEvent()
    reporter._wake = wake
    tasks = _run_tasks(reporter, repeat, 0.2, now)  # the thread starts and goes busy
    wake.reporter_thread = reporter._thread
    wake.sets_from_tasks, repeat.calls = 0, 0
    tasks += _run_tasks(reporter, repeat, 1.5, now + 1_000_000)
    busy_sets, batches = wake.sets_from_tasks, repeat.calls
    assert reporter.flush(10)
    # 1.5 s of reports is about 30 lingers, so 30 batches: none woke the thread from a task,
    # but where this loop's thread was held a whole linger (a loaded machine) and the
    # reporter went idle meanwhile.
    print(f"{batches} batches, {busy_sets} wakes from the task thread")
    assert batches >= 10
    assert busy_sets <= max(1, batches // 10), (busy_sets, batches)
    assert sum(len(repeat.history("q", f"s{i}", 1_000)) for i in range(20)) == tasks

    # Idle again after a linger with nothing: the next report wakes it, and is sent.
    time.sleep(0.3)
    assert reporter._idle
    occurrence = {"id": "late", "queue": "q", "name": "s0", "due_ms": now + 5_000_000}
    reporter.report(report_of("succeeded", occurrence))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
        entry.id == "late" for entry in repeat.history("q", "s0", 5)
    ):
        time.sleep(0.02)
    assert any(entry.id == "late" for entry in repeat.history("q", "s0", 5))
    reporter.close(5)
