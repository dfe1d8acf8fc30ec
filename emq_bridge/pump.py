"""The pump: scan -> claim -> dispatch -> ack, in batches, on any number of processes.

A tick costs one round trip per queue when nothing is due (`scan.lua`), and four per batch
when something is (scan, read the records, claim, ack), whatever the batch size. A drain's
batches start small (`FIRST_BATCH`) and grow to `batch_size`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cadence import Cadence, Misfire, advance, cadence_from_fields
from .definition import DEFINITION_FIELDS, decode_template, freeze, misfire_from_fields
from .dispatch import BatchDispatcher, Dispatcher
from .errors import RegistryError, RegistryUnavailable, ScheduleError
from .keys import parse_lease_member, validate_name
from .registry import Occurrence, Repeat, occurrence_id, redis_errors

__all__ = ["Clock", "Pump", "Tick"]

log = logging.getLogger(__name__)

Clock = Callable[[], int]
"""Returns now in epoch ms. The default is the Redis server's clock (`TIME`)."""

CadenceResolver = Callable[[str, str, Cadence], Cadence]
"""Given (queue, name, stored cadence), returns the cadence to compute next runs with."""

# A registration whose record cannot be decoded is parked this long, then retried.
CORRUPT_PARK_MS = 60_000
# A queue whose registry moves fail (not an outage) is retried this often by `run`.
BROKEN_RETRY_S = 1.0
# The first batch of a drain, before batches grow to `batch_size`.
FIRST_BATCH = 32
# Decoded definitions kept between ticks, keyed by their raw record fields; the cache is
# emptied when it holds this many, or this many bytes of template JSON.
DECODED_CACHE_SIZE = 10_000
DECODED_CACHE_BYTES = 32 * 1024 * 1024
# Policies that may evict keys without a TTL, i.e. the registry.
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


@dataclass(slots=True)
class Tick:
    """What one `run_once` did."""

    now_ms: int = 0
    dispatched: list[Occurrence] = field(default_factory=list)
    failed: list[Occurrence] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    next_wake_ms: int | None = None

    def wake_at(self, at_ms: int | None) -> None:
        if at_ms is not None and (self.next_wake_ms is None or at_ms < self.next_wake_ms):
            self.next_wake_ms = at_ms


@dataclass(frozen=True, slots=True)
class _Firing:
    """What firing one registration needs: its cadence, misfire policy and own template."""

    cadence: Cadence
    misfire: Misfire
    template: dict[str, Any]


class Pump:
    """Fires the due occurrences of `queues` through `dispatcher`.

    Any number of pumps may run on the same queues: a claim is a compare-and-set, so each
    occurrence is dispatched by one pump. If a pump dies between claim and ack, the lease
    expires after `lease_ms` and any pump re-dispatches the occurrence with the same id.
    """

    def __init__(
        self,
        repeat: Repeat,
        queues: Iterable[str],
        dispatcher: Dispatcher,
        *,
        batch_size: int = 500,
        lease_ms: int = 60_000,
        clock: Clock | None = None,
        max_sleep_s: float = 5.0,
        resolve_cadence: CadenceResolver | None = None,
    ) -> None:
        self.repeat = repeat
        self.queues = tuple(validate_name(q, "queue") for q in queues)
        if not self.queues:
            raise ValueError("a pump needs at least one queue")
        if batch_size <= 0 or lease_ms <= 0 or max_sleep_s <= 0:
            raise ValueError("batch_size, lease_ms and max_sleep_s must be positive")
        self.dispatcher = dispatcher
        self.batch_size = batch_size
        self.lease_ms = lease_ms
        self.clock = clock
        self.max_sleep_s = max_sleep_s
        self.resolve_cadence = resolve_cadence
        self._stop = threading.Event()
        self._decoded: dict[tuple[str | None, ...], _Firing] = {}
        self._decoded_bytes = 0
        # What `step` remembers between ticks to log outages and broken queues once.
        self._outage_since: float | None = None
        self._failures = 0
        self._broken: dict[str, str] = {}

    # -- one tick -------------------------------------------------------------------------

    def run_once(self, now_ms: int | None = None) -> Tick:
        """Fire everything due now (`now_ms`, else the clock, else the server's `TIME`).

        Raises `RegistryUnavailable` when Redis cannot be reached.
        """
        tick, errors = self._tick(now_ms)
        if errors:
            raise next(iter(errors.values()))
        return tick

    def _tick(self, now_ms: int | None) -> tuple[Tick, dict[str, RegistryError]]:
        """Drain every queue; a queue whose move fails (a key of the wrong type, a script
        error) is returned with its error and does not stop the others."""
        if now_ms is None and self.clock is not None:
            now_ms = self.clock()
        tick = Tick()
        errors: dict[str, RegistryError] = {}
        for queue in self.queues:
            try:
                self._drain(queue, now_ms, tick)
            except RegistryUnavailable:
                raise
            except RegistryError as exc:
                errors[queue] = exc
        return tick, errors

    def _drain(self, queue: str, now_ms: int | None, tick: Tick) -> None:
        # Slow start: a burst's first batch is small, so its first message leaves within
        # milliseconds; the batches then grow to `batch_size`, where the throughput is.
        size = min(FIRST_BATCH, self.batch_size)
        while True:
            scan = self.repeat.scan(queue, size, now_ms)
            tick.now_ms = scan.now_ms
            earliest, earliest_lease = scan.earliest_ms, scan.earliest_lease_ms
            if scan.due or scan.expired:
                earliest, earliest_lease = self._fire_batch(
                    queue, scan.now_ms, scan.due, scan.expired, tick
                )
            full = len(scan.due) >= size or len(scan.expired) >= size
            if not full or self._stop.is_set():
                # After a full batch, look again; otherwise the earliest score says when.
                tick.wake_at(earliest if not full else scan.now_ms)
                tick.wake_at(earliest_lease)
                return
            size = min(size * 4, self.batch_size)

    def _fire_batch(
        self, queue: str, now_ms: int, due: list[tuple[str, int]], expired: list[str], tick: Tick
    ) -> tuple[int | None, int | None]:
        """Claim, dispatch and ack one batch; return the earliest score and lease after it."""
        redeliveries, corrupt = self._parse_leases(queue, expired)
        if corrupt:
            expired = [m for m in expired if m not in corrupt]
        names = list(dict.fromkeys([n for n, _ in due] + [n for n, _, _ in redeliveries]))
        records = self.repeat.load_records(queue, names)
        firings: dict[str, _Firing] = {}
        candidates: list[tuple[str, int, int, int, str]] = []
        for name, score in due:
            firing = self._decode(queue, name, records.get(name, {}))
            if firing is None:
                candidates.append((name, score, now_ms + CORRUPT_PARK_MS, 0, "defer"))
                tick.parked.append(name)
                continue
            firings[name] = firing
            next_ms, missed = advance(firing.cadence, score, now_ms, firing.misfire)
            if missed:
                log.warning(
                    "%s/%s: %d slot(s) missed while no pump ran; coalesced into the one due at %d",
                    queue,
                    name,
                    missed,
                    score,
                )
            candidates.append((name, score, next_ms, missed, "fire"))
        claim = self.repeat.claim(queue, now_ms, self.lease_ms, candidates, expired)

        batch: list[Occurrence] = []
        for index in claim.claimed:
            name, score, _, missed, _ = candidates[index]
            template = firings[name].template
            batch.append(self._occurrence(queue, name, score, template, now_ms, missed=missed))
        drop: list[str] = []
        for member in claim.released:
            name, due_ms, triggered = parse_lease_member(member)
            firing = self._decode(queue, name, records.get(name, {}))
            if firing is None:
                log.error(
                    "%s/%s: lease %s dropped: the registration is gone or corrupt",
                    queue,
                    name,
                    member,
                )
                drop.append(member)
                continue
            # An expired lease is a re-dispatch, unless a trigger wrote it to fire once now.
            batch.append(
                self._occurrence(
                    queue,
                    name,
                    due_ms,
                    firing.template,
                    now_ms,
                    redelivered=not triggered,
                    triggered=triggered,
                )
            )

        accepted = [*corrupt, *drop]
        for occurrence, error in zip(batch, self._dispatch_all(batch), strict=True):
            if error is None:
                accepted.append(occurrence.lease_member)
                tick.dispatched.append(occurrence)
            else:
                # The lease stays; when it expires a pump re-dispatches with the same id.
                log.error(
                    "%s/%s: dispatch of occurrence %s failed; it is retried after the lease "
                    "(%d ms)",
                    occurrence.queue,
                    occurrence.name,
                    occurrence.id,
                    self.lease_ms,
                    exc_info=error,
                )
                tick.failed.append(occurrence)
        earliest_lease = self.repeat.ack(queue, accepted)
        return claim.earliest_ms, earliest_lease

    @staticmethod
    def _parse_leases(
        queue: str, members: list[str]
    ) -> tuple[list[tuple[str, int, bool]], set[str]]:
        """Parse expired lease members; a member edited into garbage is returned to drop."""
        parsed, corrupt = [], set()
        for member in members:
            try:
                parsed.append(parse_lease_member(member))
            except ValueError:
                log.error("%s: lease %r dropped: it is not '<name> <due_ms>'", queue, member)
                corrupt.add(member)
        return parsed, corrupt

    def _decode(self, queue: str, name: str, fields: Mapping[str, str]) -> _Firing | None:
        """Return what firing `name` needs, or None (logged) when its record is corrupt."""
        if not fields:
            log.error(
                "%s/%s: registry member has no record (or one that is not a hash); parked for %ds",
                queue,
                name,
                CORRUPT_PARK_MS // 1000,
            )
            return None
        # Validating a cadence and parsing a template cost more than the rest of a firing;
        # registrations that share a definition decode it once. The key is the raw fields
        # themselves, never a stored digest, so an edited record is decoded afresh.
        key = tuple(map(fields.get, DEFINITION_FIELDS))
        firing = self._decoded.get(key)
        if firing is None:
            try:
                firing = _Firing(
                    cadence_from_fields(dict(fields)),
                    misfire_from_fields(fields),
                    # Shared by every occurrence of these fields, so read-only.
                    freeze(decode_template(fields.get("template"))),
                )
            except (ScheduleError, ValueError, TypeError) as exc:
                log.error(
                    "%s/%s: corrupt record parked for %ds: %s",
                    queue,
                    name,
                    CORRUPT_PARK_MS // 1000,
                    exc,
                )
                return None
            size = len(fields.get("template") or "")
            if (
                len(self._decoded) >= DECODED_CACHE_SIZE
                or self._decoded_bytes + size > DECODED_CACHE_BYTES
            ):
                self._decoded.clear()
                self._decoded_bytes = 0
            self._decoded[key] = firing
            self._decoded_bytes += size
        if self.resolve_cadence is not None:
            cadence = self.resolve_cadence(queue, name, firing.cadence)
            if cadence is not firing.cadence:
                return _Firing(cadence, firing.misfire, firing.template)
        return firing

    def _occurrence(
        self,
        queue: str,
        name: str,
        due_ms: int,
        template: dict[str, Any],
        now_ms: int,
        *,
        redelivered: bool = False,
        missed: int = 0,
        triggered: bool = False,
    ) -> Occurrence:
        return Occurrence(
            queue=queue,
            name=name,
            due_ms=due_ms,
            id=occurrence_id(self.repeat.prefix, queue, name, due_ms, triggered=triggered),
            template=template,
            released_ms=now_ms,
            redelivered=redelivered,
            missed=missed,
            triggered=triggered,
        )

    def _dispatch_all(self, batch: list[Occurrence]) -> Sequence[BaseException | None]:
        """Send `batch`; return per occurrence None (accepted) or the error it failed with."""
        if not batch:
            return []
        if isinstance(self.dispatcher, BatchDispatcher):
            try:
                return self.dispatcher.dispatch_batch(batch)
            except Exception as exc:  # the adapter failed as a whole: none was accepted
                return [exc] * len(batch)
        errors: list[BaseException | None] = []
        for occurrence in batch:
            try:
                self.dispatcher.dispatch(occurrence)
            except Exception as exc:
                errors.append(exc)
            else:
                errors.append(None)
        return errors

    # -- the loop -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to finish the batch in hand and return."""
        self._stop.set()

    def run(self, stop: threading.Event | None = None) -> None:
        """Pump until `stop` (or `self.stop()`) is set.

        Sleeps until the earliest next run, or until a registry change is published, at most
        `max_sleep_s`. Redis outages are logged once and retried with backoff.
        """
        if stop is not None:
            self._stop = stop
        self.check_eviction_policy()
        subscriber: Any = None
        while not self._stop.is_set():
            if subscriber is None:
                subscriber = self._subscribe()
            _, delay = self.step()
            if self._outage_since is not None:
                _close(subscriber)  # its connection is dead too; a new one comes with Redis
                subscriber = None
            subscriber = self._wait(delay, subscriber)
        _close(subscriber)

    def step(self) -> tuple[Tick | None, float]:
        """Run one tick as `run` does, errors handled; return it and the seconds to sleep.

        An outage is logged once, then its end once, and retried with backoff (the tick is
        None). A queue whose moves fail is logged once and retried every second while the
        other queues are served. For loops owned by someone else, such as Celery's beat.
        """
        try:
            tick, errors = self._tick(None)
        except RegistryUnavailable as exc:
            if self._outage_since is None:
                self._outage_since = time.monotonic()
                log.error("Redis is unreachable; retrying with backoff until it is back: %s", exc)
            self._failures += 1
            return None, min(5.0, 0.05 * 2**self._failures)
        if self._outage_since is not None:
            log.warning(
                "Redis is reachable again after %.1fs; pumping resumes",
                time.monotonic() - self._outage_since,
            )
            self._outage_since, self._failures = None, 0
        self._broken = self._report_broken(self._broken, errors)
        delay = self._delay(tick)
        return tick, min(delay, BROKEN_RETRY_S) if errors else delay

    def _report_broken(
        self, broken: dict[str, str], errors: Mapping[str, RegistryError]
    ) -> dict[str, str]:
        """Log a failing queue once (again only if its error changes) and its recovery."""
        now_broken = {queue: str(exc) for queue, exc in errors.items()}
        for queue, message in now_broken.items():
            if broken.get(queue) != message:
                log.error(
                    "%s: a registry move failed; the other queues are served, this one is "
                    "retried every %.0fs: %s",
                    queue,
                    BROKEN_RETRY_S,
                    message,
                )
        for queue in broken.keys() - now_broken.keys():
            log.warning("%s: registry moves succeed again; pumping resumes", queue)
        return now_broken

    def _delay(self, tick: Tick) -> float:
        if tick.next_wake_ms is None:
            return self.max_sleep_s
        return min(self.max_sleep_s, max(0.0, (tick.next_wake_ms - tick.now_ms) / 1000))

    def _subscribe(self) -> Any:
        try:
            subscriber = self.repeat.client.pubsub(ignore_subscribe_messages=True)
            subscriber.subscribe(*(self.repeat.keys(q).wake_channel for q in self.queues))
        except Exception as exc:
            log.debug("no wake-up subscription, polling every %.1fs: %s", self.max_sleep_s, exc)
            return None
        return subscriber

    def _wait(self, delay: float, subscriber: Any) -> Any:
        deadline = time.monotonic() + delay
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return subscriber
            if subscriber is None:
                self._stop.wait(min(remaining, 0.2))
                continue
            try:
                if subscriber.get_message(timeout=min(remaining, 0.2)) is not None:
                    return subscriber  # a registry change: tick now
            except Exception:
                _close(subscriber)  # the connection broke; a new one is made next tick
                return None
        return subscriber

    def check_eviction_policy(self) -> str | None:
        """Warn loudly if Redis may evict registry keys; return the policy if it could be read."""
        try:
            with redis_errors("CONFIG GET maxmemory-policy"):
                if self.repeat.cluster:  # every primary holds registries: ask each one
                    client = self.repeat.client
                    reply = client.config_get("maxmemory-policy", target_nodes=client.PRIMARIES)
                else:
                    reply = self.repeat.client.config_get("maxmemory-policy")
        except Exception as exc:  # CONFIG may be disabled by ACL or a managed service
            log.info("could not read maxmemory-policy (%s); make sure it is noeviction", exc)
            return None
        per_node = bool(reply) and all(isinstance(v, dict) for v in reply.values())
        nodes = reply.values() if per_node else [reply]
        policies = [str(next(iter(node.values()), "")) if node else "" for node in nodes]
        policy = next((p for p in policies if p in EVICTING_POLICIES), policies[0])
        if policy in EVICTING_POLICIES:
            log.warning(
                "maxmemory-policy is %s: Redis may evict registry keys and lose schedules; "
                "set it to noeviction (or a volatile-* policy)",
                policy,
            )
        return policy


def _close(subscriber: Any) -> None:
    if subscriber is not None:
        try:
            subscriber.close()
        except Exception:  # closing a broken connection may itself fail; nothing to save
            log.debug("closing the wake-up subscription failed", exc_info=True)
