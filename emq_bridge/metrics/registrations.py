"""`RegistrationsCollector`: registrations by state, read from the registry on each scrape."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..errors import EmqError
from ..registry import Repeat

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

__all__ = ["STATES", "RegistrationsCollector"]

log = logging.getLogger("emq_bridge.metrics")

STATES = ("active", "paused", "parked", "completed")
NAME = "emq_bridge_registrations"
DOCUMENTATION = (
    "Registrations by state (active, paused, parked, completed), read from the registry."
)


class RegistrationsCollector:
    """A `prometheus_client` collector of `emq_bridge_registrations{queue, state}`.

    Each scrape reads `queues` (default: every queue of the prefix, found with SCAN) with
    `Repeat.count_states`: two reads per queue, plus the records of paused ones. Register it
    on the registry that is scraped: `registry.register(RegistrationsCollector(repeat))`.
    If Redis cannot be read, the scrape goes on without this family (one WARNING per
    failure streak), so the other metrics still arrive.
    """

    def __init__(self, repeat: Repeat, queues: Iterable[str] | None = None) -> None:
        self.sources: list[tuple[Repeat, tuple[str, ...] | None]] = []
        self._failing = False
        self.add(repeat, queues)

    def add(self, repeat: Repeat, queues: Iterable[str] | None = None) -> None:
        """Count `queues` of `repeat` too (a second pump of the process, say): one family,
        one series per queue."""
        self.sources.append((repeat, tuple(queues) if queues is not None else None))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family without samples: registering reads nothing from Redis."""
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        counts: dict[str, dict[str, int]] = {}
        try:
            for repeat, queues in self.sources:
                for queue in queues if queues is not None else repeat.queues():
                    if queue not in counts:  # a queue named by two sources is counted once
                        counts[queue] = repeat.count_states(queue)
        except EmqError as exc:
            if not self._failing:
                self._failing = True
                log.warning("%s left out of the scrape: the registry cannot be read: %s", NAME, exc)
            return
        if self._failing:
            self._failing = False
            log.info("%s: the registry can be read again", NAME)
        for queue, states in counts.items():
            for state in STATES:
                family.add_metric([queue, state], states.get(state, 0))
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(NAME, DOCUMENTATION, labels=("queue", "state"))
