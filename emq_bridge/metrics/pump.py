"""`MetricsEvents`: a pump listener that counts what the pump did, in Prometheus metrics."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..events import PumpEvents, Tick
from ..occurrence import Occurrence
from .families import PumpFamilies, families

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["MetricsEvents"]


class MetricsEvents(PumpEvents):
    """Count a pump's dispatches, failures, re-sends, misses, skips, lost occurrences, ticks
    and outages, and observe each dispatch's lag, on `registry` (default
    `prometheus_client.REGISTRY`). Hand it to `Pump(listeners=[...])`, or use `install(pump)`.

    The families are made on the first event, not here, so a listener built when an app
    module is imported does not import `prometheus_client` before a framework set up its
    multiprocess directory.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry
        self._families: PumpFamilies | None = None
        # Per queue: when its last batch was claimed (monotonic), and the label children.
        self._claimed_at: dict[str, float] = {}
        self._children: dict[tuple[str, str], Any] = {}

    @property
    def families(self) -> PumpFamilies:
        if self._families is None:
            self._families = families(self.registry).pump
        return self._families

    def _child(self, family: str, queue: str) -> Any:
        """The `queue` child of `family`, kept: `labels()` takes a lock and builds a key."""
        key = (family, queue)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(self.families, family).labels(queue)
        return child

    def on_claim(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        self._claimed_at[queue] = time.monotonic()

    def on_dispatch(self, occurrence: Occurrence) -> None:
        queue = occurrence.queue
        self._child("dispatched", queue).inc()
        # Sent - when it was to be sent (its nominal time, or a jittered slot's jittered
        # instant: the jitter is on purpose, not lateness), on the server's clock: the claim's
        # time (released_ms) plus the time since the claim. A host clock would mix two clocks.
        claimed = self._claimed_at.get(queue)
        since_s = time.monotonic() - claimed if claimed is not None else 0.0
        due_ms = occurrence.send_at_ms or occurrence.due_ms
        lag_s = (occurrence.released_ms - due_ms) / 1000 + since_s
        self._child("dispatch_lag", queue).observe(max(0.0, lag_s))

    def on_dispatch_failure(self, occurrence: Occurrence, error: BaseException) -> None:
        self._child("failed", occurrence.queue).inc()

    def on_registration_failed(self, occurrence: Occurrence, error: BaseException) -> None:
        self._child("failed", occurrence.queue).inc()

    def on_redispatch(self, occurrence: Occurrence) -> None:
        self._child("redispatched", occurrence.queue).inc()

    def on_missed(self, queue: str, name: str, missed: int, due_ms: int) -> None:
        self._child("missed", queue).inc(missed)

    def on_skip(self, queue: str, name: str, due_ms: int) -> None:
        self._child("skipped", queue).inc()

    def on_lost(self, queue: str, name: str, due_ms: int, occurrence_id: str) -> None:
        families(self.registry).outcomes.outcomes.labels(queue, "lost").inc()

    def on_tick(self, tick: Tick) -> None:
        found = self.families
        found.ticks.inc()
        found.last_tick.set(time.time())

    def on_outage_begin(self, error: BaseException) -> None:
        self.families.outages.inc()

    def on_outage_end(self, seconds: float) -> None:
        self.families.outage_seconds.inc(max(0.0, seconds))
