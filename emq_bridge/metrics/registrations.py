"""`RegistrationsCollector`: registrations by state, read from the registry on each scrape."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import EmqError
from ..keys import queue_names
from ..registry import Repeat

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

__all__ = ["STATES", "RegistrationsCollector"]

log = logging.getLogger("emq_bridge.metrics")

STATES = ("active", "paused", "parked", "completed")
# How long a scrape waits for the registry's counts: a server that hangs (no answer, no
# refusal) would hold it for the client's socket timeout (30 s), past Prometheus's default
# scrape timeout (10 s), and every other family of the scrape would be lost with it.
READ_TIMEOUT_S = 5.0
NAME = "emq_bridge_registrations"
DOCUMENTATION = (
    "Registrations by state (active, paused, parked, completed), read from the registry."
)


@dataclass(frozen=True, slots=True)
class _Source:
    """The queues of one `Repeat` a collector reads, with what a newer source replaces it by."""

    repeat: Callable[[], Repeat | None]  # None once a weakly held Repeat is gone
    queues: tuple[str, ...] | None  # None: every queue of the prefix (SCAN)
    key: tuple[str, tuple[str, ...] | None]  # the prefix and the set of queues


class RegistrationsCollector:
    """A `prometheus_client` collector of `emq_bridge_registrations{queue, state}`.

    Each scrape reads `queues` (default: every queue of the prefix, found with SCAN) with
    `Repeat.count_states`: two reads per queue, plus the records of paused ones. Register it
    on the registry that is scraped: `registry.register(RegistrationsCollector(repeat))`.
    If Redis cannot be read, or does not answer within `READ_TIMEOUT_S` (a hung server),
    the scrape goes on without this family (one WARNING per failure streak), so the other
    metrics still arrive; a read that timed out and still waits is waited for by the next
    scrape rather than doubled.

    With `weak`, the collector does not keep `repeat` alive: once nothing else holds it (its
    pump is gone), its queues drop out (what `install(pump)` uses, see `add`).
    """

    def __init__(
        self, repeat: Repeat, queues: Iterable[str] | None = None, *, weak: bool = False
    ) -> None:
        self._sources: list[_Source] = []
        self._failing = False
        self.read_timeout_s = READ_TIMEOUT_S
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="emq-bridge-metrics")
        self._reader_pid = os.getpid()
        self._pending: Future[dict[str, dict[str, int]]] | None = None
        self._lock = threading.Lock()
        self.add(repeat, queues, weak=weak)

    @property
    def sources(self) -> list[tuple[Repeat, tuple[str, ...] | None]]:
        """The `(repeat, queues)` read at each scrape, oldest first (a gone one left out)."""
        live = []
        for source in self._sources:
            repeat = source.repeat()
            if repeat is not None:
                live.append((repeat, source.queues))
        return live

    def add(
        self, repeat: Repeat, queues: Iterable[str] | None = None, *, weak: bool = False
    ) -> None:
        """Count `queues` of `repeat` too (a second pump of the process, say): one family,
        one series per queue.

        A source of the same prefix and queues is replaced, not added to: it is a pump
        rebuilt after a crash or a reload, whose old `Repeat` is closed (a scrape would open
        it again) and shows nothing this one does not (one series per queue). Its server is
        left out of the comparison on purpose: a reload may point it at another one, and the
        newest is the one the process uses. With `weak`, `repeat` is not kept alive by this
        collector: when nothing else holds it, its queues drop out.
        """
        chosen = queue_names(queues) if queues is not None else None
        key = (repeat.prefix, None if chosen is None else tuple(sorted(set(chosen))))
        held: Callable[[], Repeat | None] = weakref.ref(repeat) if weak else (lambda: repeat)
        with self._lock:  # a new list each time: a scrape reads the one it found
            kept = [s for s in self._sources if s.key != key and s.repeat() is not None]
            self._sources = [*kept, _Source(held, chosen, key)]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family without samples: registering reads nothing from Redis."""
        yield self._family()

    def _counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        # Newest first: a queue named by two sources is counted once, from the pump the
        # process built last (the older one is closed, or about to be).
        for repeat, queues in reversed(self.sources):
            for queue in queues if queues is not None else repeat.queues():
                if queue not in counts:
                    counts[queue] = repeat.count_states(queue)
        return counts

    def _read(self) -> dict[str, dict[str, int]]:
        """The counts, read on the collector's thread within `read_timeout_s`; EmqError or
        TimeoutError when they cannot be had in time."""
        if self._reader_pid != os.getpid():
            # A forked child (a preloading server's worker): the executor's thread and the
            # lock's holder, if any, were the parent's; a read would wait for them forever.
            # A scrape is rare: one getpid each is nothing.
            self._lock = threading.Lock()
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="emq-bridge-metrics")
            self._reader_pid, self._pending = os.getpid(), None
        with self._lock:  # a read still waiting (it timed out, or a scrape beside this one)
            pending = self._pending  # is waited for again, not doubled
            if pending is None or pending.done():
                pending = self._pending = self._reader.submit(self._counts)
        try:
            return pending.result(timeout=self.read_timeout_s)
        except FutureTimeout:
            raise TimeoutError(f"no answer within {self.read_timeout_s:g}s") from None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        try:
            counts = self._read()
        except (EmqError, TimeoutError) as exc:
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
