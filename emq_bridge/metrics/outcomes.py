"""`OutcomeMetrics`: counts what this process reports of occurrences, by status."""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..events import OutcomeEvents
from ..outcome import BEAT_KINDS, Report
from .families import OutcomeFamilies, families, multiprocess_dir

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["MAX_QUEUES", "OutcomeMetrics"]

# The queues whose outcome series a process keeps (the ones it reported on most recently).
# Per-tenant queues come and go, and a worker cannot tell a queue that is gone from one that
# is quiet without reading Redis on its reporter's thread, so the bound is on recency: a
# queue is dropped only after this many others reported since its last report. Each one
# costs about 25 series (7 statuses, a 16-bucket histogram) and some kB of this process.
MAX_QUEUES = 1_000


def check_max_queues(value: int) -> int:
    """`value`, or ConfigError if it is not a positive int."""
    if type(value) is not int or value <= 0:
        raise ConfigError(f"max_queues must be a positive int, got {value!r}")
    return value


class _QueueSeries:
    """The series of one queue this listener made: its status counters and its run lag."""

    __slots__ = ("counters", "run_lag")

    def __init__(self) -> None:
        self.counters: dict[str, Any] = {}
        self.run_lag: Any = None


class OutcomeMetrics(OutcomeEvents):
    """Count the reports of this process's workers in `emq_bridge_outcomes_total{queue,
    status}` and observe the run lag of first attempts, on `registry` (default
    `prometheus_client.REGISTRY`). Add it with `install_outcomes()`.

    Called on the reporter's thread with each batch, so a task never pays for it. The
    families are made on the first batch (see `MetricsEvents`). The series of at most
    `max_queues` queues are kept: reporting on one more removes those of the queue reported
    on least recently (a counter that comes back starts again from 0, which Prometheus'
    `rate` and `increase` read as a reset). In multiprocess mode prometheus_client cannot
    remove a series, so they are all kept, as its files keep them.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, max_queues: int = MAX_QUEUES
    ) -> None:
        self.registry = registry
        self.max_queues = check_max_queues(max_queues)
        self._families: OutcomeFamilies | None = None
        # Least recently reported first; the reporter's thread and `Repeat.finished` callers
        # may report at once.
        self._queues: OrderedDict[str, _QueueSeries] = OrderedDict()
        self._lock = threading.Lock()
        _LIVE.add(self)

    @property
    def families(self) -> OutcomeFamilies:
        if self._families is None:
            self._families = families(self.registry).outcomes
        return self._families

    @property
    def queues(self) -> list[str]:
        """The queues whose series are kept, least recently reported first."""
        with self._lock:
            return list(self._queues)

    def _series(self, queue: str) -> _QueueSeries:
        """The series of `queue`, now the most recent (its lock held)."""
        found = self._queues.get(queue)
        if found is not None:
            self._queues.move_to_end(queue)
            return found
        while len(self._queues) >= self.max_queues:
            self._forget(*self._queues.popitem(last=False))
        found = self._queues[queue] = _QueueSeries()
        return found

    def _forget(self, queue: str, series: _QueueSeries) -> None:
        if multiprocess_dir() is not None:  # not removable there (prometheus_client warns)
            return
        for status in series.counters:
            self.families.outcomes.remove(queue, status)
        if series.run_lag is not None:
            self.families.run_lag.remove(queue)

    def _count(self, queue: str, status: str) -> None:
        with self._lock:
            series = self._series(queue)
            child = series.counters.get(status)
            if child is None:
                child = series.counters[status] = self.families.outcomes.labels(queue, status)
            child.inc()

    def _started(self, report: Report, started_ms: int) -> None:
        self._count(report.queue, "started")
        if report.attempt == 1:  # a retry's start is late by its countdown, not by the pump
            lag_s = max(0.0, (started_ms - report.due_ms) / 1000)
            with self._lock:
                series = self._series(report.queue)
                if series.run_lag is None:
                    series.run_lag = self.families.run_lag.labels(report.queue)
                series.run_lag.observe(lag_s)

    def on_reports(self, reports: Sequence[Report]) -> None:
        for report in reports:
            kind = report.kind
            if kind in BEAT_KINDS:
                continue
            if kind == "started":
                self._started(report, report.at_ms)
                continue
            if report.started_ms is not None:  # a start folded into this final report
                self._started(report, report.started_ms)
            self._count(report.queue, kind)


# Each `OutcomeMetrics` of this process: a forked child gets a new lock for each. The one it
# inherits may have been held by another thread of the parent at the fork (the reporter's
# thread, a `Repeat.finished` caller), and would then block the child's first report for
# ever (a user's fork pool reporting from its jobs, with `install_outcomes()` at import).
_LIVE: weakref.WeakSet[OutcomeMetrics] = weakref.WeakSet()


def _after_fork() -> None:
    for metrics in list(_LIVE):
        metrics._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork)
