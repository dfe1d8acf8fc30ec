"""The metric families of emq-bridge on one `prometheus_client` registry, made once per registry.

`prometheus_client` is imported only when a family set is first made, never when
`emq_bridge.metrics` is imported: its multiprocess mode is chosen at its own import, from
`PROMETHEUS_MULTIPROC_DIR`, and Dramatiq's `Prometheus` middleware sets that variable only
once its worker process booted, after the app module (which may import us) was loaded.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "LAG_BUCKETS_S",
    "Families",
    "OutcomeFamilies",
    "PumpFamilies",
    "families",
    "multiprocess_dir",
]

# Lag buckets, in seconds: a pump on time sends within milliseconds; a misfire or an outage
# makes it minutes or hours.
LAG_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


def multiprocess_dir() -> str | None:
    """Return prometheus_client's multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`), or None."""
    # prometheus_client still honours the old lowercase name (Dramatiq sets both).
    legacy = os.environ.get("prometheus_multiproc_dir")  # noqa: SIM112
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or legacy


@dataclass(frozen=True, slots=True)
class PumpFamilies:
    """What pumps count (docs/metrics.md lists them)."""

    dispatched: Counter
    failed: Counter
    redispatched: Counter
    missed: Counter
    skipped: Counter
    dispatch_lag: Histogram
    ticks: Counter
    last_tick: Gauge
    outages: Counter
    outage_seconds: Counter


@dataclass(frozen=True, slots=True)
class OutcomeFamilies:
    """What became of occurrences: workers' reports, and the pumps' `lost`."""

    outcomes: Counter
    run_lag: Histogram


class Families:
    """The emq-bridge families of one registry, each group made on its first use: a process
    that only runs tasks shows no pump metrics (a pump's last tick at 0 would look stale)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._pump: PumpFamilies | None = None
        self._outcomes: OutcomeFamilies | None = None

    @property
    def pump(self) -> PumpFamilies:
        if self._pump is None:
            with _lock:
                if self._pump is None:
                    self._pump = _pump_families(self.registry)
        return self._pump

    @property
    def outcomes(self) -> OutcomeFamilies:
        if self._outcomes is None:
            with _lock:
                if self._outcomes is None:
                    self._outcomes = _outcome_families(self.registry)
        return self._outcomes


_made: dict[int, Families] = {}
_lock = threading.RLock()


def default_registry() -> CollectorRegistry:
    from prometheus_client import REGISTRY

    return REGISTRY


def families(registry: CollectorRegistry | None = None) -> Families:
    """Return the families of `registry` (default `prometheus_client.REGISTRY`), registered
    there when first used."""
    target = default_registry() if registry is None else registry
    found = _made.get(id(target))
    if found is not None and found.registry is target:
        return found
    with _lock:
        found = _made.get(id(target))
        if found is None or found.registry is not target:
            found = _made[id(target)] = Families(target)
        return found


def _lag(registry: CollectorRegistry, name: str, doc: str) -> Histogram:
    from prometheus_client import Histogram

    return Histogram(name, doc, ("queue",), buckets=LAG_BUCKETS_S, registry=registry)


def _pump_families(registry: CollectorRegistry) -> PumpFamilies:
    from prometheus_client import Counter, Gauge

    def counter(name: str, doc: str) -> Counter:
        return Counter(name, doc, ("queue",), registry=registry)

    options: dict[str, Any] = {"multiprocess_mode": "max"}  # the latest tick of any process
    return PumpFamilies(
        dispatched=counter(
            "emq_bridge_occurrences_dispatched_total", "Occurrences the broker accepted."
        ),
        failed=counter(
            "emq_bridge_occurrences_failed_total",
            "Occurrences the broker refused (re-sent after their lease) or that can never be "
            "sent (their registration is parked).",
        ),
        redispatched=counter(
            "emq_bridge_occurrences_redispatched_total",
            "Occurrences sent again, same id, after their lease expired unacked.",
        ),
        missed=counter(
            "emq_bridge_occurrences_missed_total",
            "Slots no pump claimed in time (stopped, or behind) that the misfire policy dropped.",
        ),
        skipped=counter(
            "emq_bridge_occurrences_skipped_total",
            "Slots not sent because an occurrence was in flight (overlap policy).",
        ),
        dispatch_lag=_lag(
            registry,
            "emq_bridge_dispatch_lag_seconds",
            "How late an occurrence was sent: sent minus nominal time (the server's clock).",
        ),
        ticks=Counter(
            "emq_bridge_pump_ticks_total", "Pump ticks over all their queues.", registry=registry
        ),
        last_tick=Gauge(
            "emq_bridge_pump_last_tick_timestamp_seconds",
            "When a pump last finished a tick (Unix time).",
            registry=registry,
            **options,
        ),
        outages=Counter(
            "emq_bridge_outages_total", "Times a pump found Redis unreachable.", registry=registry
        ),
        outage_seconds=Counter(
            "emq_bridge_outage_seconds_total",
            "Seconds pumps spent with Redis unreachable (counted when it is back).",
            registry=registry,
        ),
    )


def _outcome_families(registry: CollectorRegistry) -> OutcomeFamilies:
    from prometheus_client import Counter

    return OutcomeFamilies(
        outcomes=Counter(
            "emq_bridge_outcomes_total",
            "What became of occurrences, as workers reported it (status started, succeeded, "
            "failed, retrying, skipped, revoked) and the pump marked it (lost).",
            ("queue", "status"),
            registry=registry,
        ),
        run_lag=_lag(
            registry,
            "emq_bridge_run_lag_seconds",
            "How late an occurrence started: its first attempt's start (the worker's clock) "
            "minus its nominal time.",
        ),
    )
