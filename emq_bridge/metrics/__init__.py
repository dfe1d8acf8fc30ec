"""Prometheus metrics of emq-bridge (`pip install 'emq-bridge[metrics]'`): docs/metrics.md.

* `MetricsEvents`: a pump listener (`emq_bridge.events.PumpEvents`) counting what pumps do;
* `OutcomeMetrics`: an outcome listener counting what workers report, by status;
* `RegistrationsCollector`: registrations by state, read from the registry on scrape;
* `install(pump)` wires all three on a registry, `install_outcomes()` the second alone (in
  worker processes), and `serve(port)` exposes a registry over HTTP (multiprocess-aware).

Metrics go to `prometheus_client.REGISTRY` unless a `registry` is given, so an app's own
exporter (Dramatiq's `Prometheus` middleware, a Celery worker's `start_http_server`) already
serves them; under `PROMETHEUS_MULTIPROC_DIR` every process writes its own files and the
exposition adds them up. Importing this package does not import `prometheus_client`.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

# Found, not imported (see families.py): without it the first tick's metrics would fail in a
# pump listener, and every later one go missing, where this says which extra is missing.
try:
    _FOUND = find_spec("prometheus_client") is not None
except (ImportError, ValueError):  # a finder refusing it; a module set to None
    _FOUND = False
if not _FOUND:
    raise ImportError(
        "emq_bridge.metrics needs prometheus_client: pip install 'emq-bridge[metrics]'"
    )

from ..events import add_outcome_listener, remove_outcome_listener
from ..pump import Pump
from .families import LAG_BUCKETS_S, multiprocess_dir
from .outcomes import MAX_QUEUES, OutcomeMetrics, check_max_queues
from .pump import MetricsEvents
from .registrations import STATES, RegistrationsCollector
from .serve import MetricsServer, exposition_registry, serve

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "LAG_BUCKETS_S",
    "MAX_QUEUES",
    "STATES",
    "MetricsEvents",
    "MetricsServer",
    "OutcomeMetrics",
    "RegistrationsCollector",
    "exposition_registry",
    "install",
    "install_outcomes",
    "multiprocess_dir",
    "serve",
    "uninstall_outcomes",
]

_outcomes: dict[int, OutcomeMetrics] = {}
# The registrations collector `install` registered on each registry: a second pump adds its
# queues to it (a second collector of the same family would be refused). It holds each pump's
# Repeat weakly, and a pump rebuilt on the same queues replaces the old one's: a process that
# rebuilds its pump (after a crash, at a reload) does not pile up closed Repeats read at scrape.
_collectors: dict[int, tuple[CollectorRegistry, RegistrationsCollector]] = {}


def _unless_default(registry: CollectorRegistry | None) -> CollectorRegistry | None:
    """None for `prometheus_client.REGISTRY` given by name: one listener for it, either way
    (without importing prometheus_client when it was not)."""
    client = sys.modules.get("prometheus_client")
    return None if client is not None and registry is client.REGISTRY else registry


def install_outcomes(
    registry: CollectorRegistry | None = None, *, max_queues: int | None = None
) -> OutcomeMetrics:
    """Count this process's occurrence reports on `registry` (default `REGISTRY`); once per
    registry, however often called. Call it where the app is imported, before a prefork
    pool forks: the children inherit it. `max_queues` (default `MAX_QUEUES`) bounds the
    queues whose series it keeps (see `OutcomeMetrics`)."""
    bound = None if max_queues is None else check_max_queues(max_queues)
    registry = _unless_default(registry)
    key = id(registry)
    found = _outcomes.get(key)
    if found is None or found.registry is not registry:
        found = _outcomes[key] = OutcomeMetrics(registry)
    if bound is not None:
        found.max_queues = bound
    add_outcome_listener(found)
    return found


def uninstall_outcomes(registry: CollectorRegistry | None = None) -> None:
    """Stop counting this process's reports on `registry` (see `install_outcomes`)."""
    found = _outcomes.pop(id(_unless_default(registry)), None)
    if found is not None:
        remove_outcome_listener(found)


def install(
    pump: Pump,
    registry: CollectorRegistry | None = None,
    *,
    outcomes: bool = True,
    registrations: bool = True,
) -> MetricsEvents:
    """Add a `MetricsEvents` on `registry` (default `REGISTRY`) to `pump` and return it
    (the one it has, if it was installed before on that registry).

    With `outcomes`, this process's reports are counted too (`install_outcomes`). With
    `registrations`, a `RegistrationsCollector` of the pump's queues is registered on
    `registry`, except in multiprocess mode, where only the exposition's registry can hold
    it (`exposition_registry([RegistrationsCollector(...)])`). One collector serves every
    pump installed on a registry: a pump's queues stay in it while its `Repeat` lives, and a
    pump of the same prefix and queues installed later replaces them (a rebuilt pump).
    """
    registry = _unless_default(registry)  # REGISTRY named or not: one listener for it
    for listener in pump.events.listeners:  # installed already: counted once
        if isinstance(listener, MetricsEvents) and listener.registry is registry:
            return listener
    events = MetricsEvents(registry)
    pump.add_listener(events)
    if outcomes:
        install_outcomes(registry)
    if registrations and multiprocess_dir() is None:
        from .families import default_registry

        target = default_registry() if registry is None else registry
        found = _collectors.get(id(target))
        if found is not None and found[0] is target:
            found[1].add(pump.repeat, pump.queues, weak=True)
        else:
            collector = RegistrationsCollector(pump.repeat, pump.queues, weak=True)
            target.register(collector)
            _collectors[id(target)] = (target, collector)
    return events
