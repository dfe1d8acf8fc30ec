"""`OutcomeMetrics`: counts what this process reports of occurrences, by status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..events import OutcomeEvents
from ..outcome import Report
from .families import OutcomeFamilies, families

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["OutcomeMetrics"]


class OutcomeMetrics(OutcomeEvents):
    """Count the reports of this process's workers in `emq_bridge_outcomes_total{queue,
    status}` and observe the run lag of first attempts, on `registry` (default
    `prometheus_client.REGISTRY`). Add it with `install_outcomes()`.

    Called on the reporter's thread with each batch, so a task never pays for it. The
    families are made on the first batch (see `MetricsEvents`).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry
        self._families: OutcomeFamilies | None = None
        self._children: dict[tuple[str, str], Any] = {}

    @property
    def families(self) -> OutcomeFamilies:
        if self._families is None:
            self._families = families(self.registry).outcomes
        return self._families

    def _count(self, queue: str, status: str) -> None:
        key = (queue, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.families.outcomes.labels(queue, status)
        child.inc()

    def _started(self, report: Report, started_ms: int) -> None:
        self._count(report.queue, "started")
        if report.attempt == 1:  # a retry's start is late by its countdown, not by the pump
            lag_s = max(0.0, (started_ms - report.due_ms) / 1000)
            self.families.run_lag.labels(report.queue).observe(lag_s)

    def on_reports(self, reports: Sequence[Report]) -> None:
        for report in reports:
            kind = report.kind
            if kind == "heartbeat":
                continue
            if kind == "started":
                self._started(report, report.at_ms)
                continue
            if report.started_ms is not None:  # a start folded into this final report
                self._started(report, report.started_ms)
            self._count(report.queue, kind)
