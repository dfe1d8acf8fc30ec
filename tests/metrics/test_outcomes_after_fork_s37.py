"""`OutcomeMetrics` counts in a child forked while another thread of the parent held its lock
(found by a probe of fork safety, session 37): a user's fork pool whose parent reports from
threads, with `install_outcomes()` at import as docs/metrics.md says, hung its children on
their first report for ever. The child gets a new lock. A real fork."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from emq_bridge import Report

prometheus_client = pytest.importorskip("prometheus_client")

from emq_bridge.metrics.outcomes import OutcomeMetrics  # noqa: E402


def _report_in_child(metrics: OutcomeMetrics, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    report = Report("succeeded", "q", "a", "id-1", 1_800_000_000_000, 1_800_000_001_000)
    metrics.on_reports([report])
    out.put(metrics.queues)


def test_a_child_forked_while_the_lock_is_held_still_counts() -> None:
    metrics = OutcomeMetrics(prometheus_client.CollectorRegistry())
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with metrics._lock:  # another thread reports at the moment of the fork
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_report_in_child, args=(metrics, out))
    try:
        child.start()
        assert out.get(timeout=20) == ["q"]  # before: the child blocked on the lock for ever
    finally:
        release.set()
        holder.join(10)
        child.join(10)
        if child.is_alive():
            child.kill()
