"""The pump: scan -> claim -> dispatch -> ack, in batches, on any number of processes.

A tick costs one round trip when nothing is due, whatever the number of queues (the first
`scan.lua` of every queue in one pipeline), and four per batch when something is (scan,
read the records, claim, ack), whatever the batch size. A drain's batches start small
(`FIRST_BATCH`) and grow to `batch_size`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .cadence import Cadence, CatchUp, Misfire, catch_up, now_arg
from .definition import DEFINITION_FIELDS, Definition
from .dispatch import BatchDispatcher, Dispatcher, batch_failure
from .errors import (
    BrokerUnreachable,
    ConfigError,
    DispatchError,
    PermanentDispatchError,
    RegistryError,
    RegistryRedirected,
    RegistryUnavailable,
)
from .events import Broadcast, LoggingEvents, PumpEvents, Tick
from .heartbeat import Heartbeat
from .jitter import Jittered, immediate_instant, nominal_slot
from .keys import Lease, lease_member, parse_lease_member, queue_names
from .lease_keeper import SentAcker
from .lifecycle import GUARDED_MODES, START_TIMEOUT_MS, check_history_size
from .occurrence import Occurrence, occurrence_id
from .outcome import HISTORY_SIZE
from .pump_options import check_pump_options
from .registry import Claim, Repeat, Scan, WakeSubscription, WakeupsRefused, clock_ms
from .reporting import RETRY_MAX_S
from .template import decode_frozen
from .template_pieces import join_template

__all__ = ["Clock", "Pump", "Tick"]  # Tick lives in events; re-exported for its old path

log = logging.getLogger(__name__)

Clock = Callable[[], int]
"""Returns now in epoch ms, an int. The default is the registry's (`Repeat.clock`, a test's),
else the Redis server's clock (`TIME`)."""

CadenceResolver = Callable[[str, str, Cadence], Cadence]
"""Given (queue, name, stored cadence), returns the cadence to compute next runs with."""

# How often a pump checks again a schedule another app's pump decides (`NotHere`).
NOT_HERE_RECHECK_MS = 1000
# A registration whose record cannot be decoded is parked this long, then retried.
CORRUPT_PARK_MS = 60_000
# Why a registry member whose record is missing (or not a hash) is parked.
NO_RECORD = "registry member has no record (or one that is not a hash)"
# A queue whose registry moves fail (not an outage: a key of the wrong type, a cluster slot
# that keeps redirecting) is left out of `step`'s pipeline of scans (so `run`'s, beat's and the
# Dramatiq thread's) and retried on its own, after the other queues, at most this often.
BROKEN_RETRY_S = 1.0
# A wake-up subscription that breaks sooner than this after it was made is not trusted to
# say a change may have been missed: the sleep polls on instead of ticking at once.
RESUBSCRIBE_S = 1.0
# The record fields that say when a registration last ran (for a checked cadence).
LAST_RUN_FIELDS = ("last_fired_ms", "last_due_ms", "created_ms")
# What a batch reads of its records, in its one fetch: the definition, the last run (for a
# checked cadence) and the previous-run context.
# And the cadence's digest, which the claim compares (an edit between the read and the claim).
RECORD_FIELDS = (
    *DEFINITION_FIELDS,
    *dict.fromkeys((*LAST_RUN_FIELDS, "last_success_ms", "buffered_previous_ms")),
    "cadence_digest",
)
# How often a running pump reads the eviction policy again (it warns once per change).
EVICTION_CHECK_S = 60.0
# The first batch of a drain, before batches grow to `batch_size`.
FIRST_BATCH = 32
# A tick's first scan of a queue serves its drain if it is at most this old (and a tenth
# of the lease); a queue reached later, after others were drained, is scanned again.
SCAN_FRESH_S = 0.1
# How long one tick of a pump's loop (`step`, so `run`, Celery's beat and the Dramatiq thread)
# drains before it ends, even while batches come back full: a pump behind a backlog ends its
# tick to write its heartbeat and tell its listeners (`on_tick`), and lets go of what the
# tick sent, then goes on at once. `run_once` fires everything due, whatever it takes. (A
# tick that never ended let the heartbeat lapse while the pump sent, and held every
# occurrence it sent in `Tick.dispatched`.)
TICK_BUDGET_S = 2.0
# Where the template is among a record's definition fields (the decode cache's keys).
_TEMPLATE_AT = DEFINITION_FIELDS.index("template")
# Decoded definitions kept between ticks, keyed by their raw record fields; the cache is
# emptied when it holds this many, or this many bytes of template JSON.
DECODED_CACHE_SIZE = 10_000
DECODED_CACHE_BYTES = 32 * 1024 * 1024
# The template a cached shape holds (`Pump._decode`): none of its own.
_NO_TEMPLATE: Mapping[str, Any] = MappingProxyType({})
# Once asked to stop, a pump sending a batch one occurrence at a time goes on this long, then
# hands back the leases of what it has not sent, so a stop ends within about this time.
STOP_GRACE_S = 0.5
# A process that runs the pump in its main thread (`emq-bridge pump`, `celery beat -S emq`)
# interrupts a send still blocked this long after a stop signal (a broker that hangs never
# lets it see the stop): the grace, then time for the acks and the hand-back.
STOP_DEADLINE_S = STOP_GRACE_S + 2.5
# A guarded occurrence whose message expires (`Dispatcher.expiry_ms`) stays in flight this
# long past its expiry before it is lost: a worker that took it just before may report its
# start a little later.
EXPIRY_MARGIN_MS = 5_000
# A parked registration's reason is kept to this many characters.
MAX_PARK_REASON = 500
# After an outage of the registry, an occurrence whose lost deadline passed is marked lost
# only this long after the pump saw Redis again: its worker, alive through the outage, kept
# its heartbeats and its final report (a run that ended meanwhile) and sends them once it
# sees Redis again, its tries at most `RETRY_MAX_S` apart; marked at once, it was lost when
# it had succeeded (and a `skip` schedule was freed while it ran).
LOST_GRACE_S = 3 * RETRY_MAX_S


@dataclass(frozen=True, slots=True)
class NotHere:
    """The checked cadence a pump with a `resolve_cadence` gives a registration whose
    schedule lives in an app's objects (`cadence_label`) that it cannot resolve as stored:
    never due here, checked again after `NOT_HERE_RECHECK_MS` (a pump that has the schedule
    claims it at a check; two pumps race for each, so it waits a check or two at most)."""

    label: str

    @property
    def kind(self) -> str:
        return "elsewhere"

    def first_run(self, now_ms: int) -> int:
        return now_ms + NOT_HERE_RECHECK_MS

    def next_after(self, after_ms: int) -> int:
        return after_ms + NOT_HERE_RECHECK_MS

    def check(self, last_run_ms: int, now_ms: int) -> tuple[bool, int]:
        return False, now_ms + NOT_HERE_RECHECK_MS

    def to_fields(self) -> dict[str, str]:  # never written: a pump only reads records
        return {"cadence_label": self.label}

    def describe(self) -> str:
        return f"{self.label} (decided by another app's pump)"


class _LeaseLost(Exception):
    """The outcome of an occurrence whose lease another pump took while this one was sending."""


_LOST = _LeaseLost()


class _Unsent(Exception):
    """The outcome of an occurrence not sent because the pump stopped: its lease goes back."""


_UNSENT = _Unsent()


@dataclass(frozen=True, slots=True)
class _Broken:
    """A queue whose moves failed (not an outage), as `step` keeps it between ticks."""

    # What its error was told as (None: a cluster's redirections, `RegistryRedirected`,
    # told once per spell whatever move met them): another error is told again.
    told: str | None
    # When it is tried again: ms of the pump's clock when it has one (a test's), else of
    # `time.monotonic`.
    retry_ms: int


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class NewerCodeLive(DispatchError):
    """A send this process's code cannot make, left to the pumps of newer code."""


@dataclass(slots=True)
class _Sending:
    """A batch being sent: the outcome of each occurrence so far, and its leases' deadline.

    Kept outside the sending loop, so what was sent is known when the loop is interrupted.
    """

    deadline: int
    # When (monotonic) the batch's leases were taken, about: from before its claim.
    begun: float = field(default_factory=time.monotonic)
    outcomes: list[BaseException | None] = field(default_factory=list)
    # When the claim released them (epoch ms, the claim's clock): what their acks count.
    released_ms: int = 0


@dataclass(frozen=True, slots=True)
class _PendingAck:
    """A batch's ack that failed after the broker accepted it (Redis restarting, a slot
    migrating), kept to be tried again while its leases last: a transient failure must not
    become a re-send once they expire."""

    accepted: tuple[str, ...]  # the lease members of what the broker accepted
    deadline_ms: int  # the deadline they hold (the claim's server clock): the ack's fence
    released_ms: int  # when the claim released them: what the ack counts in `fired`
    unsent: tuple[Occurrence, ...]  # handed back by the same ack (a stop), told once it is
    # When (monotonic) the leases expire, about: from before the claim, so a little early.
    expires_at: float


@dataclass(frozen=True, slots=True)
class _Firing:
    """What firing one registration needs: its cadence, misfire policy and own template."""

    cadence: Cadence
    misfire: Misfire
    template: Mapping[str, Any]
    overlap: str = "allow"
    catchup_window_ms: int | None = None
    catchup_max: int | None = None
    end_ms: int | None = None  # the `end_at` bound: no slot after it to catch up on

    def with_template(self, template: Mapping[str, Any]) -> _Firing:
        """This firing with another template (what `dataclasses.replace` gives, built
        directly: it runs once per registration fired when templates are distinct)."""
        return _Firing(
            self.cadence,
            self.misfire,
            template,
            self.overlap,
            self.catchup_window_ms,
            self.catchup_max,
            self.end_ms,
        )


class Pump:
    """Fires the due occurrences of `queues` through `dispatcher`.

    Any number of pumps may run on the same queues: a claim is a compare-and-set, so each
    occurrence is dispatched by one pump. If a pump dies between claim and ack, the lease
    expires after `lease_ms` and any pump re-dispatches the occurrence with the same id.
    An ack that fails (Redis restarting, a cluster slot migrating) is tried again before the
    queue's next drains while its leases last, and once more when `run` ends, so a failure
    shorter than the lease sends nothing twice. What it does is told to `listeners`
    (`emq_bridge.events.PumpEvents`); its log lines are one such listener, always installed.
    `code` is the (source, generation) of the declarations the process runs, when it has
    one (the generation None without one): a registration it can never send is then not
    parked while the queue holds a newer generation, nor, with `code_synced_ms` (when those
    declarations were synced, server ms), while its record is one that source rewrote
    since: newer code of a rolling deploy wrote it (see `Repeat.park`).
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
        listeners: Iterable[PumpEvents] = (),
        start_timeout_ms: int = START_TIMEOUT_MS,
        history_size: int = HISTORY_SIZE,
        code: tuple[str, int | None] | None = None,
        code_synced_ms: int | None = None,
    ) -> None:
        self.repeat = repeat
        self.code = code
        self.code_synced_ms = code_synced_ms
        self.queues = queue_names(queues)
        if not self.queues:
            raise ValueError("a pump needs at least one queue")
        check_pump_options(batch_size=batch_size, lease_ms=lease_ms, max_sleep_s=max_sleep_s)
        self.dispatcher = dispatcher
        self.batch_size = batch_size
        self.lease_ms = lease_ms
        self.clock = clock
        self.max_sleep_s = max_sleep_s
        self.resolve_cadence = resolve_cadence
        if type(start_timeout_ms) is not int or start_timeout_ms <= 0:
            raise ConfigError(f"start_timeout_ms must be a positive int, got {start_timeout_ms!r}")
        self.start_timeout_ms = start_timeout_ms
        self.history_size = check_history_size(history_size)
        self.events = Broadcast([LoggingEvents(), *listeners])
        self._stop = threading.Event()
        self._decoded: dict[tuple[str | None, ...], _Firing] = {}
        # The same, keyed by every definition field but the template (see `_decode`).
        self._shapes: dict[tuple[str | None, ...], _Firing] = {}
        self._decoded_bytes = 0
        # The registrations this pump leaves to another app's pumps (`NotHere`), told once
        # (at most `DECODED_CACHE_SIZE` remembered: see `_tell_not_here`).
        self._not_here: set[tuple[str, str]] = set()
        # What `step` remembers between ticks to report outages and broken queues once.
        self._outage_since: float | None = None
        # Until when (monotonic) lost deadlines wait, after an outage (`LOST_GRACE_S`).
        self._lost_held_until = 0.0
        # True while a send to the broker is in progress (the dispatcher's call): what a
        # stop that hangs tells, the broker or the registry (`celery beat`'s overdue stop).
        self.sending = False
        self._failures = 0
        # The wake-up subscription `listen` makes and `sleep` waits on (None: polling).
        self._wakeups: WakeSubscription | None = None
        self._listened_at = 0.0  # when (monotonic) the subscription was made
        self._wakeups_refused = False  # the server refused it (an ACL): the pump polls
        # The queues whose moves fail, left out of the tick's scans and retried on their own.
        self._broken: dict[str, _Broken] = {}
        # Per queue, oldest first: the acks that failed, retried before its next drains.
        self._pending_acks: dict[str, list[_PendingAck]] = {}
        # Per queue, the leases this (old) code could not send while newer code is live
        # (`NewerCodeLive`), each with when (server ms) this pump may take it again: until
        # then they are left to the newer pumps, which would otherwise lose the race for them
        # at every expiry to this pump, which wakes at exactly that instant.
        self._left_to_newer: dict[str, dict[str, int]] = {}
        self.eviction_check_s = EVICTION_CHECK_S
        self._policy: str | None = None
        self._policy_read_at: float | None = None
        # Written from `step` (so `run`, beat and the Dramatiq thread), never `run_once`.
        self.heartbeat = Heartbeat(self.queues, max_sleep_s=max_sleep_s)

    def add_listener(self, listener: PumpEvents) -> None:
        """Tell `listener` what this pump does from now on (after the listeners it has)."""
        self.events.add(listener)

    # -- one tick -------------------------------------------------------------------------

    def run_once(self, now_ms: int | None = None) -> Tick:
        """Fire everything due now (`now_ms`, else the pump's clock, else the registry's
        `Repeat.clock`, else the server's `TIME`).

        Raises `RegistryUnavailable` when Redis cannot be reached, and the first queue's
        `RegistryError` when a queue's moves fail.
        """
        tick, errors, _ = self._tick(now_arg(now_ms))
        self.events.on_tick(tick)
        if errors:
            raise next(iter(errors.values()))
        return tick

    def _tick(
        self,
        now_ms: int | None,
        budget_s: float | None = None,
        *,
        left_out: Collection[str] = (),
        alone: Sequence[str] = (),
    ) -> tuple[Tick, dict[str, RegistryError], list[str]]:
        """Drain every queue; a queue whose move fails (a key of the wrong type, a script
        error, a cluster slot that kept redirecting) is returned with its error and does not
        stop the others. With `budget_s` (a pump's loop, `step`), the tick ends once it has
        lasted that long, the next starting at once; without (`run_once`: "everything due
        now"), it drains until nothing is due.

        The first scan of every queue goes in one pipeline (`Repeat.scan_many`), so an idle
        tick is one round trip however many queues the pump serves; only the queues with
        something due, expired or lost are then drained, one after the other. A queue with
        acks that failed has them tried again first (`_retry_acks`); one that fails again
        fails the queue as its drain would.

        The queues in `left_out` (`step`'s broken ones) are not in that pipeline: a slot
        that keeps redirecting would hold it up, redis-py retrying its redirections, at
        every tick. Of them, those in `alone` (the ones due for their retry) are scanned and
        drained one by one after the others. Returns the tick, the errors, and the queues of
        `alone` it reached (a stop may end the tick before).
        """
        if now_ms is None:
            now_ms = self._clock_now()
        tick = Tick()
        errors: dict[str, RegistryError] = {}
        retried: list[str] = []
        if self._stop.is_set():  # asked to stop: claim nothing more
            return tick, errors, retried
        size = min(FIRST_BATCH, self.batch_size)
        scanned_at = time.monotonic()
        deadline = scanned_at + budget_s if budget_s is not None else math.inf
        queues = [q for q in self.queues if q not in left_out] if left_out else self.queues
        scans = self.repeat.scan_many(queues, size, now_ms) if queues else []
        # A drain takes time; a queue drained after it is scanned again, so its claim's
        # clock and lease deadline are not that much older (a lease must outlive a send).
        fresh_s = min(SCAN_FRESH_S, self.lease_ms / 10_000)
        for queue, scan in zip(queues, scans, strict=True):
            if self._stop.is_set():  # asked to stop: claim nothing more
                break
            if isinstance(scan, RegistryError):
                errors[queue] = scan
                continue
            # An idle queue's scan only says when to wake: no round trip more, however old.
            fresh = _idle(scan) or time.monotonic() - scanned_at < fresh_s
            self._serve(queue, now_ms, tick, size, scan, fresh, deadline, errors)
        for queue in alone:
            if self._stop.is_set():
                break
            retried.append(queue)
            self._serve(queue, now_ms, tick, size, None, True, deadline, errors)
        return tick, errors, retried

    def _serve(
        self,
        queue: str,
        now_ms: int | None,
        tick: Tick,
        size: int,
        scan: Scan | None,
        fresh: bool,
        deadline: float,
        errors: dict[str, RegistryError],
    ) -> None:
        """Try `queue`'s failed acks again, then drain it (`_drain`), from `scan` if `fresh`
        (a scan that is not is scanned again); without `scan`, it is scanned first, on its
        own. A `RegistryError` of its moves goes to `errors`; an outage is raised."""
        try:
            if scan is None:
                scan = self.repeat.scan(queue, size, now_ms)
            self._retry_acks(queue, scan.now_ms)
            self._drain(queue, now_ms, tick, size, scan if fresh else None, deadline)
        except RegistryUnavailable:
            raise
        except RegistryError as exc:
            errors[queue] = exc

    def _clock_now(self) -> int | None:
        """Now by the pump's clock, else by the registry's (`Repeat.clock`, a test's), else
        None: the server's `TIME`, which the scan reads itself (no round trip more). Either
        clock must return epoch ms as an int (`ConfigError` otherwise, see `clock_ms`)."""
        if self.clock is not None:
            return clock_ms(self.clock, "a pump clock")
        if self.repeat.clock is not None:
            return self.repeat.server_time_ms()
        return None

    def _drain(
        self,
        queue: str,
        now_ms: int | None,
        tick: Tick,
        size: int,
        scan: Scan | None,
        deadline: float,
    ) -> None:
        """Fire batches of `queue` until one is not full, starting from `scan` if given, or
        the tick's `deadline` (monotonic) passes: the next tick then starts at once.

        Slow start: a burst's first batch is small (`size`), so its first message leaves
        within milliseconds; the batches then grow to `batch_size`, where the throughput is.
        """
        while True:
            if scan is None:
                scan = self.repeat.scan(queue, size, now_ms)
            tick.now_ms = max(tick.now_ms, scan.now_ms)
            if scan.unreadable:
                self._set_aside(queue, scan)
            held_s = self._lost_held_until - time.monotonic() if scan.lost else 0.0
            if held_s > 0:  # after an outage: the workers' heartbeats and reports come first
                tick.wake_at(scan.now_ms + math.ceil(held_s * 1000))
            elif scan.lost:
                self._mark_lost(queue, scan.lost)
            earliest, earliest_lease = scan.earliest_ms, scan.earliest_lease_ms
            left = self._left_to_newer_code(queue, scan.now_ms)
            expired = [m for m in scan.expired if m not in left] if left else scan.expired
            if scan.due or expired:
                earliest, earliest_lease = self._fire_batch(
                    queue, scan.now_ms, scan.due, expired, tick
                )
            if left and earliest_lease is not None and earliest_lease <= scan.now_ms:
                # Expired, and left to newer code: wake when this pump may take it again.
                earliest_lease = min(left.values())
            lost = 0 if held_s > 0 else len(scan.lost)
            full = max(len(scan.due), len(expired), lost) >= size
            if not full or self._stop.is_set() or time.monotonic() >= deadline:
                # After a full batch, look again; otherwise the earliest score says when.
                tick.wake_at(earliest if not full else scan.now_ms)
                tick.wake_at(earliest_lease)
                tick.wake_at(scan.earliest_running_ms)  # so a silent worker is lost on time
                return
            size = min(size * 4, self.batch_size)
            scan = None

    def _left_to_newer_code(self, queue: str, now_ms: int) -> dict[str, int]:
        """The leases of `queue` this pump leaves to newer code at `now_ms` (those whose
        time passed are forgotten)."""
        left = self._left_to_newer.get(queue)
        if not left:
            return {}
        for member in [m for m, until in left.items() if until <= now_ms]:
            del left[member]
        return left

    def _set_aside(self, queue: str, scan: Scan) -> None:
        """Hold the registry members that are not valid UTF-8, or no valid name, for
        `CORRUPT_PARK_MS` (told as a corrupt record's park is), and drop such lease and
        in-flight members."""
        self.repeat.set_aside(queue, scan.unreadable, scan.now_ms + CORRUPT_PARK_MS)
        for where, member in scan.unreadable:
            shown = member.decode("utf-8", "backslashreplace")
            if where == "due":
                what = "not valid UTF-8" if _not_utf8(member) else "no valid name"
                # No command takes such a name: say how to remove it.
                reason = f"registry member is {what} (written by hand?): remove it with ZREM"
                self.events.on_park(queue, shown, reason, CORRUPT_PARK_MS)
            else:
                self.events.on_lease_dropped(queue, shown, "the member is not valid UTF-8")

    def _mark_lost(self, queue: str, members: list[str]) -> None:
        marked = self.repeat.mark_lost(
            queue,
            members,
            history_size=self.history_size,
            start_timeout_ms=self.start_timeout_ms,
        )
        for name, due_ms, ident in marked:
            self.events.on_lost(queue, name, due_ms, ident)

    def _fire_batch(
        self, queue: str, now_ms: int, due: list[tuple[str, int]], expired: list[str], tick: Tick
    ) -> tuple[int | None, int | None]:
        """Claim, dispatch and ack one batch; return the earliest score and lease after it.

        However the sending ends, the batch is settled: what the broker accepted is acked,
        what was not sent is handed back (an interruption, a stop), what can never be sent
        is parked; only a refused send keeps its lease, to be retried when it expires.
        """
        begun = time.monotonic()  # the leases' age counts from here, before the claim
        redeliveries, corrupt = self._parse_leases(queue, expired)
        if corrupt:
            expired = [m for m in expired if m not in corrupt]
        names = list(dict.fromkeys([n for n, _ in due] + [lease.name for lease in redeliveries]))
        records = self.repeat.load_records(queue, names, RECORD_FIELDS)
        firings: dict[str, _Firing] = {}
        candidates: list[tuple[str, int, int, int, str, int]] = []
        steps: dict[int, CatchUp] = {}  # what the misfire policy dropped, by candidate index
        # Read with no record: corrupt, or removed (a sync pruning it, a cancel) and perhaps
        # registered again since. The claim sets it aside only while it still has none.
        unread = [name for name, _ in due if not records.get(name)]
        decoded = {
            name: self._decode(queue, name, records[name]) for name, _ in due if records.get(name)
        }
        last_runs = _last_runs(decoded, records)
        steps_made: dict[tuple[Any, ...], tuple[Cadence, CatchUp]] = {}
        for name, score in due:
            if name not in decoded:
                candidates.append((name, score, now_ms + CORRUPT_PARK_MS, 0, "unread", score))
                continue
            candidate = self._candidate(
                queue, name, score, decoded[name], last_runs.get(name, now_ms), now_ms, steps_made
            )
            if candidate is None:
                candidates.append((name, score, now_ms + CORRUPT_PARK_MS, 0, "defer", score))
                tick.parked.append(name)
                continue
            firings[name], next_ms, mode, step = candidate
            if step is None:  # a checked cadence: it fires the score or defers
                candidates.append((name, score, next_ms, 0, mode, score))
                continue
            # A jittered score stands for its nominal slot: the occurrence's id and due; the
            # `immediately` run (scored at the registration instant) for itself.
            immediate = immediate_instant(records.get(name, {}))
            if step.missed:
                steps[len(candidates)] = _nominal_step(firings[name].cadence, step, immediate)
            fire = score if step.fire_ms is None else step.fire_ms
            fire = nominal_slot(firings[name].cadence, fire, immediate)
            candidates.append(
                (name, score, next_ms, step.missed, "drop" if step.fire_ms is None else mode, fire)
            )
        claim = self.repeat.claim(
            queue,
            now_ms,
            self.lease_ms,
            candidates,
            expired,
            start_timeout_ms=self.start_timeout_ms,
            history_size=self.history_size,
            cadence_digests=[records.get(c[0], {}).get("cadence_digest", "") for c in candidates],
            start_timeouts=self._start_timeouts(candidates, firings),
        )
        for index in claim.dropped:  # told once, by the pump whose claim counted them
            if index in steps:
                self._missed(queue, candidates[index][0], steps[index])
        for index in claim.skipped:
            self.events.on_skip(queue, candidates[index][0], candidates[index][5])
        for index in claim.buffered:
            self.events.on_buffer(queue, candidates[index][0], candidates[index][5])
        if corrupt:  # garbage holds no deadline of ours: dropped unfenced
            # Not kept when it fails (`_retry_acks`): nothing was sent yet, the next scan
            # finds the garbage again.
            self.repeat.ack(queue, sorted(corrupt))
        batch: list[Occurrence] = []
        sending = _Sending(now_ms + self.lease_ms, begun, released_ms=now_ms)
        try:
            self._send_claimed(queue, now_ms, claim, candidates, firings, records, batch, sending)
        except BaseException:
            # SystemExit (Celery's beat signal handler), KeyboardInterrupt: settle what is
            # known before it goes on, so no claimed occurrence waits out its lease.
            self._hand_back_interrupted(queue, now_ms, batch, sending)
            raise
        earliest_lease = self._settle(queue, now_ms, batch, sending, records, tick)
        if unread:  # after the batch is settled: a read failing here delays no send
            self._tell_unread(queue, unread, tick)
        return claim.earliest_ms, earliest_lease

    def _tell_unread(self, queue: str, names: list[str], tick: Tick) -> None:
        """Report, as parked, those of `names` (due, read with no record) that still have
        no record but a registry member: corrupt (evicted, deleted by hand), set aside by
        the claim. One removed since (a sync pruning it, a cancel) is gone, and one
        registered again since (a cancel and re-add) is a fresh registration: neither is
        corrupt, nor was it set aside (claim.lua decided, from what it read). Two reads
        more, only when a record was missing."""
        now_read = self.repeat.load_records(queue, names, ("template",))
        missing = [name for name in names if not now_read.get(name)]
        gone = self.repeat.absent(queue, missing)
        for name in names:
            if name in missing and name not in gone:
                self.events.on_park(queue, name, NO_RECORD, CORRUPT_PARK_MS)
                tick.parked.append(name)
            else:
                log.debug("%s/%s: removed or registered again since its read", queue, name)

    def _start_timeouts(
        self, candidates: Sequence[tuple[Any, ...]], firings: Mapping[str, _Firing]
    ) -> list[int | None]:
        """Per candidate, how long a guarded occurrence stays in flight before a worker starts
        it, when that is not `start_timeout_ms`; None for the default. Empty when the
        dispatcher knows neither expiry nor delay (the common case: nothing is computed).

        Its message may expire sooner (the dispatcher's `expiry_ms`: a broker may drop it
        unseen, as RabbitMQ drops a Celery task past its `expires`, and nothing would report
        it): the expiry bounds it. Or the task waits before a worker may start it (the
        dispatcher's `delay_ms`: a Celery `countdown` or `eta`): the wait is added, so a task
        waiting out its countdown is not lost, nor its next slot sent beside it."""
        expiry_of = getattr(self.dispatcher, "expiry_ms", None)
        delay_of = getattr(self.dispatcher, "delay_ms", None)
        if expiry_of is None and delay_of is None:
            return []
        bounds: list[int | None] = []
        for candidate in candidates:
            bound = None
            if candidate[4] in GUARDED_MODES and (firing := firings.get(candidate[0])):
                delay = delay_of(firing.template) if delay_of is not None else None
                expiry = expiry_of(firing.template) if expiry_of is not None else None
                longest = self.start_timeout_ms + (delay or 0)
                if expiry is not None and expiry + EXPIRY_MARGIN_MS < longest:
                    bound = max(0, expiry) + EXPIRY_MARGIN_MS
                elif delay:
                    bound = longest
            bounds.append(bound)
        return bounds if any(b is not None for b in bounds) else []

    def _send_claimed(
        self,
        queue: str,
        now_ms: int,
        claim: Claim,
        candidates: list[tuple[str, int, int, int, str, int]],
        firings: Mapping[str, _Firing],
        records: Mapping[str, Mapping[str, str]],
        batch: list[Occurrence],
        sending: _Sending,
    ) -> None:
        """Build the occurrences of `claim` into `batch` and send them, outcomes into `sending`."""
        replaced: dict[int, list[str]] = {}  # a `replace` takes over every run in flight
        for index, previous in claim.replaced:
            replaced.setdefault(index, []).append(previous)
        for index in claim.claimed:
            name, score, _, missed, _, fire = candidates[index]
            template = firings[name].template
            occurrence = self._occurrence(
                queue,
                name,
                fire,
                template,
                now_ms,
                missed=missed,
                record=records.get(name),
                guarded=firings[name].overlap != "allow",
                # A jittered score is the instant its slot was to be sent (the lag's start).
                send_at_ms=score if score > fire else None,
            )
            for previous in replaced.get(index, ()):
                self._replace(occurrence, previous)
            batch.append(occurrence)
        drop: list[str] = []
        for member in claim.released:
            name, due_ms, triggered, pending, backfill = parse_lease_member(member)
            fields = records.get(name)
            # No record: nothing to park here (the lease only is dropped), so nothing said so.
            firing = self._decode(queue, name, fields) if fields else None
            if firing is None:
                self.events.on_lease_dropped(queue, member, "the registration is gone or corrupt")
                # The lease claim wrote.
                drop.append(lease_member(name, due_ms, triggered, backfill))
                continue
            # An expired lease is a re-dispatch, unless it is a trigger's pending member:
            # claim.lua turned that into the trigger's lease, so this is its first send.
            occurrence = self._occurrence(
                queue,
                name,
                due_ms,
                firing.template,
                now_ms,
                redelivered=not pending,
                triggered=triggered,
                record=records.get(name),
                guarded=firing.overlap != "allow" and not (triggered or backfill),
            )
            if backfill:  # a past slot a backfill queued (backfill.py): marked as such
                occurrence = replace(occurrence, backfill=True, previous_due_ms=None)
            if occurrence.redelivered:
                self.events.on_redispatch(occurrence)
            batch.append(occurrence)
        if batch:
            self.events.on_claim(queue, batch)
        if drop:  # leases this claim just wrote, of registrations gone
            self.repeat.ack(queue, drop, deadline_ms=sending.deadline)
        self._dispatch_all(queue, batch, sending)

    def _replace(self, occurrence: Occurrence, previous: str) -> None:
        """Revoke the occurrence in flight `previous` that `occurrence` replaces, where the
        dispatcher can (`revoke(occurrence_id)`); a failure to revoke is reported, not raised."""
        lease = parse_lease_member(previous)
        previous_id = occurrence_id(
            self.repeat.prefix,
            occurrence.queue,
            lease.name,
            lease.due_ms,
            triggered=lease.triggered,
        )
        revoke = getattr(self.dispatcher, "revoke", None)
        revoked = False
        if revoke is not None:
            try:
                revoke(previous_id)
                revoked = True
            except Exception as exc:  # the new one is sent all the same
                log.warning("%s: revoking %s failed: %s", occurrence.name, previous_id, exc)
        self.events.on_replace(occurrence, previous_id, revoked)

    def _settle(
        self,
        queue: str,
        now_ms: int,
        batch: list[Occurrence],
        sending: _Sending,
        records: Mapping[str, Mapping[str, str]],
        tick: Tick,
    ) -> int | None:
        """Ack (and count) what was accepted, hand back what was not sent, park what never can
        be; return the earliest lease deadline after the ack.

        An ack that fails (`RegistryError`, an outage too) is kept for `_retry_acks` and
        raised: the tick reports it as any failed move of the queue, whose next ticks try it
        again while its leases last. What can never be sent is then not parked: its leases
        expire, and it is tried (and parked) again.
        """
        outcomes, deadline = sending.outcomes, sending.deadline
        accepted: list[str] = []
        unsent: list[Occurrence] = []
        permanent: dict[str, list[tuple[Occurrence, PermanentDispatchError]]] = {}
        for occurrence, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                accepted.append(occurrence.lease_member)
                tick.dispatched.append(occurrence)
                self.events.on_dispatch(occurrence)
            elif outcome is _LOST:
                self.events.on_lease_lost(occurrence)
            elif outcome is _UNSENT:
                unsent.append(occurrence)
            elif isinstance(outcome, PermanentDispatchError):
                permanent.setdefault(occurrence.name, []).append((occurrence, outcome))
            else:
                # The lease stays; when it expires a pump re-dispatches with the same id.
                tick.failed.append(occurrence)
                self.events.on_dispatch_failure(occurrence, outcome)
        # Fenced by the deadline this pump wrote: a lease another pump re-took stays its own.
        try:
            earliest_lease = self.repeat.ack(
                queue,
                accepted,
                deadline_ms=deadline,
                released_ms=now_ms,
                hand_back=[o.lease_member for o in unsent],
            )
        except RegistryError:
            if accepted or unsent:
                lease_s = (deadline - now_ms) / 1000  # as held since the claim
                failed = _PendingAck(
                    tuple(accepted), deadline, now_ms, tuple(unsent), sending.begun + lease_s
                )
                self._pending_acks.setdefault(queue, []).append(failed)
            raise
        if unsent:
            self.events.on_hand_back(queue, unsent)
        for name, failures in permanent.items():
            self._park(queue, name, failures, records.get(name, {}), deadline, now_ms, tick)
        return earliest_lease

    def _retry_acks(self, queue: str, now_ms: int) -> None:
        """Try again, oldest first, the acks of `queue` that failed (`_settle`), whose leases
        are still held at `now_ms` (its scan's server clock, the one their deadlines are in).

        The ack is fenced by the deadline, so a retry drops and counts in `fired` only what
        the failed try did not (its script may have run before the reply was lost), and
        nothing another pump re-took. An ack whose leases expired is dropped, told once: its
        occurrences may be sent again (same ids, marked redelivered), as after a crash. A
        retry that fails raises as the first try did, and stays for the next tick.
        """
        pending = self._pending_acks.get(queue)
        if not pending:
            return
        expired = [ack for ack in pending if ack.deadline_ms <= now_ms]
        if expired:
            pending[:] = [ack for ack in pending if ack.deadline_ms > now_ms]
            lost = sum(len(ack.accepted) for ack in expired)
            if lost:  # what was handed back only goes out as it was to
                log.warning(
                    "%s: the ack of %d sent occurrence(s) failed and their leases expired "
                    "before it could be retried: they may be sent again (same ids, marked "
                    "redelivered)",
                    queue,
                    lost,
                )
        while pending:
            self._ack_again(queue, pending[0])
            pending.pop(0)
        del self._pending_acks[queue]

    def _ack_again(self, queue: str, ack: _PendingAck) -> None:
        """Make the failed `ack` again (fenced, counted, handing back what it did)."""
        self.repeat.ack(
            queue,
            ack.accepted,
            deadline_ms=ack.deadline_ms,
            released_ms=ack.released_ms,
            hand_back=[o.lease_member for o in ack.unsent],
        )
        log.info("%s: the failed ack of %d occurrence(s) went through", queue, len(ack.accepted))
        if ack.unsent:
            self.events.on_hand_back(queue, list(ack.unsent))

    def _park(
        self,
        queue: str,
        name: str,
        failures: list[tuple[Occurrence, PermanentDispatchError]],
        fields: Mapping[str, str],
        deadline: int,
        now_ms: int,
        tick: Tick,
    ) -> None:
        """Park `name`, whose occurrences can never be sent, and drop their leases."""
        occurrence, error = failures[0]
        reason = " ".join(str(error).split()).removeprefix(f"{queue}/{name}: ")  # shown under it
        reason = reason[:MAX_PARK_REASON] or type(error).__name__
        parked = self.repeat.park(
            queue,
            name,
            [o.lease_member for o, _ in failures],
            deadline_ms=deadline,
            template=fields.get("template", ""),
            reason=reason,
            now_ms=now_ms,
            code=self.code,
            code_synced_ms=self.code_synced_ms,
        )
        tick.failed.extend(o for o, _ in failures)
        if parked == 1:
            tick.parked.append(name)
            self.events.on_registration_failed(occurrence, error)
        elif parked == 0:  # parked already (a trigger of a parked registration, say)
            for failed, _ in failures:
                self.events.on_lease_dropped(
                    queue, failed.lease_member, f"its registration is parked: {reason}"
                )
        elif parked == -2:  # its template changed since: the new one is tried after the lease
            for failed, exc in failures:
                self.events.on_dispatch_failure(failed, exc)
        elif parked == -3:  # this is old code of a rolling deploy: a newer pump may send it
            left = self._left_to_newer.setdefault(queue, {})
            for failed, exc in failures:
                # Its lease expires at `deadline` for the newer pumps to take; this one keeps
                # off it for one lease more (then tries again, should none have come).
                left[failed.lease_member] = deadline + self.lease_ms
                self.events.on_dispatch_failure(
                    failed, NewerCodeLive(f"{exc}; not parked: newer code of its source is live")
                )
        # -1: cancelled meanwhile, with its leases (a record now is a registration added
        # again since, not parked: park.lua); nothing is left to do.

    def _hand_back_interrupted(
        self, queue: str, now_ms: int, batch: list[Occurrence], sending: _Sending
    ) -> None:
        """Ack what the broker accepted before an interruption and hand back the rest.

        The occurrence being sent when it came may have left: it is handed back too, and
        the pump that sends it marks it redelivered (same id). Redis failing here is logged;
        the leases then expire as after a crash: this ack is not kept for `_retry_acks`, the
        process is on its way out (a `SystemExit`, a `KeyboardInterrupt`).
        """
        known = list(zip(batch, sending.outcomes, strict=False))  # the rest was not sent yet
        sent = [o for o, out in known if out is None]
        accepted = [o.lease_member for o in sent]
        rest = [o for o, out in known if out is not None and out is not _LOST]
        rest += batch[len(known) :]
        for occurrence in sent:
            self.events.on_dispatch(occurrence)
        try:
            self.repeat.ack(
                queue,
                accepted,
                deadline_ms=sending.deadline,
                released_ms=now_ms,
                hand_back=[o.lease_member for o in rest],
            )
        except Exception as exc:  # Redis is gone too: as after a crash, the leases expire
            log.warning("%s: the interrupted batch could not be settled (%s)", queue, exc)
            return
        if rest:
            self.events.on_hand_back(queue, rest)

    def _parse_leases(self, queue: str, members: list[str]) -> tuple[list[Lease], set[str]]:
        """Parse expired lease members; a member edited into garbage is returned to drop."""
        parsed, corrupt = [], set()
        for member in members:
            try:
                parsed.append(parse_lease_member(member))
            except ValueError:
                self.events.on_lease_dropped(
                    queue, member, "it is not '<name> <due_ms>' (+ 'triggered' or 'manual')"
                )
                corrupt.add(member)
        return parsed, corrupt

    def _candidate(
        self,
        queue: str,
        name: str,
        score: int,
        firing: _Firing | None,
        last_run_ms: int,
        now_ms: int,
        steps_made: dict[tuple[Any, ...], tuple[Cadence, CatchUp]] | None = None,
    ) -> tuple[_Firing, int, str, CatchUp | None] | None:
        """Return the firing of a due `name`, its next score, the claim's mode (`fire`, the
        overlap policy; `defer` when a checked cadence is not due) and what its misfire policy
        decided (`catch_up`; None for a checked cadence), or None.

        None (reported) parks the record: whatever one record does wrong, even in a
        custom schedule's own code, harms that record only. `last_run_ms` is used by a
        checked cadence only. `steps_made` keeps the decisions of one batch (same `now_ms`).
        """
        if firing is None:
            return None
        check = getattr(firing.cadence, "check", None)
        try:
            if check is not None:
                due, next_ms = check(last_run_ms, now_ms)
                if not next_ms > now_ms:
                    raise ValueError(f"its next check {next_ms!r} is not after now ({now_ms})")
                mode = ("fire" if firing.overlap == "allow" else firing.overlap) if due else "defer"
                return firing, int(next_ms), mode, None
            # `catch_up` is pure math of these: registrations that share a cadence (the
            # pump decodes it once for them) and are due at the same instant share it.
            key = (
                id(firing.cadence),
                score,
                firing.misfire,
                firing.catchup_window_ms,
                firing.catchup_max,
                firing.end_ms,
            )
            made = steps_made.get(key) if steps_made is not None else None
            if made is not None and made[0] is firing.cadence:
                step = made[1]
            else:
                step = catch_up(
                    firing.cadence,
                    score,
                    now_ms,
                    firing.misfire,
                    window_ms=firing.catchup_window_ms,
                    max_runs=firing.catchup_max,
                    end_ms=firing.end_ms,
                )
                if steps_made is not None:
                    steps_made[key] = (firing.cadence, step)
        except Exception as exc:
            self.events.on_park(
                queue, name, f"its next run cannot be computed: {exc!r}", CORRUPT_PARK_MS
            )
            return None
        mode = "fire" if firing.overlap == "allow" else firing.overlap
        return firing, step.next_ms, mode, step

    def _missed(self, queue: str, name: str, step: CatchUp) -> None:
        """Tell what the misfire policy dropped: `on_catch_up`, and `on_missed` (older form)."""
        self.events.on_catch_up(queue, name, step)
        fired_for = step.next_ms if step.fire_ms is None else step.fire_ms
        self.events.on_missed(queue, name, step.missed, fired_for)

    def _decode(self, queue: str, name: str, fields: Mapping[str, str]) -> _Firing | None:
        """Return what firing `name` needs, or None (reported) when its record (read, not
        empty: see `_tell_unread`) is unusable."""
        # Decoding a definition costs more than the rest of a firing; registrations that
        # share one decode it once. The key is the raw fields themselves, never a stored
        # digest, so an edited record is decoded afresh.
        key = tuple(map(fields.get, DEFINITION_FIELDS))
        firing = self._decoded.get(key)
        try:
            if firing is None:
                # Registrations that differ only in their template (a per-tenant schedule,
                # a beat_schedule with its own args) share the rest of their decode.
                rest = key[:_TEMPLATE_AT] + key[_TEMPLATE_AT + 1 :]
                shape = self._shapes.get(rest)
                if shape is None:
                    definition = Definition.from_fields(fields)
                    firing = _Firing(
                        definition.cadence,
                        definition.misfire,
                        definition.template,
                        definition.overlap,
                        definition.catchup_window_ms,
                        definition.catchup_max,
                        definition.bounds.end_ms,
                    )
                    if len(self._shapes) >= DECODED_CACHE_SIZE:
                        self._shapes.clear()
                    # Kept without its template, which each registration brings its own of:
                    # the decoded templates of thousands of shapes would escape the byte
                    # budget `_remember` keeps.
                    self._shapes[rest] = firing.with_template(_NO_TEMPLATE)
                else:
                    firing = shape.with_template(decode_frozen(join_template(fields)))
                self._remember(key, firing, len(fields.get("template") or ""))
            if self.resolve_cadence is not None:
                cadence = self.resolve_cadence(queue, name, firing.cadence)
                label = fields.get("cadence_label")
                if label and getattr(cadence, "label", None) != label:
                    # A schedule only its app's objects decide (a Celery solar, say), which
                    # this pump's app has not, or has as another version (a rolling deploy):
                    # its stored interval is only a placeholder, so it is not fired here.
                    cadence = NotHere(label)
                    self._tell_not_here(queue, name, label)
                if cadence is not firing.cadence:
                    return replace(firing, cadence=cadence)
        # Any exception: a record must never stop the pump (a poison pill for its queue).
        except Exception as exc:
            self.events.on_park(queue, name, f"corrupt record: {exc}", CORRUPT_PARK_MS)
            return None
        return firing

    def _tell_not_here(self, queue: str, name: str, label: str) -> None:
        """Log once that `name` is left to another app's pumps (it is checked each second)."""
        if (queue, name) in self._not_here:
            return
        if len(self._not_here) >= DECODED_CACHE_SIZE:  # bounded like the decode caches
            self._not_here.clear()  # (each name is then told once more)
        self._not_here.add((queue, name))
        log.warning(
            "%s/%s is decided by a schedule object this pump's app does not have as stored "
            "(%s): left to a pump whose app has it; while none runs, it does not fire",
            queue,
            name,
            label,
        )

    def _remember(self, key: tuple[str | None, ...], firing: _Firing, size: int) -> None:
        """Cache a decoded firing, emptying the cache when it holds too many or too much."""
        if len(self._decoded) >= DECODED_CACHE_SIZE or self._decoded_bytes + size > (
            DECODED_CACHE_BYTES
        ):
            self._decoded.clear()
            self._decoded_bytes = 0
        self._decoded[key] = firing
        self._decoded_bytes += size

    def _occurrence(
        self,
        queue: str,
        name: str,
        due_ms: int,
        template: Mapping[str, Any],
        now_ms: int,
        *,
        redelivered: bool = False,
        missed: int = 0,
        triggered: bool = False,
        record: Mapping[str, str] | None = None,
        guarded: bool = False,
        send_at_ms: int | None = None,
    ) -> Occurrence:
        # The previous-run context, from the record as fetched before this claim.
        previous = last_success = None
        if record:
            last_due = record.get("last_due_ms", "")
            if last_due.isdigit() and int(last_due) < due_ms:
                previous = int(last_due)
            elif last_due == str(due_ms) and not redelivered:
                # A buffered slot released (report.lua): its release noted the one before.
                before = record.get("buffered_previous_ms", "")
                previous = int(before) if before.isdigit() else None
            success = record.get("last_success_ms", "")
            last_success = int(success) if success.isdigit() else None
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
            previous_due_ms=previous,
            last_success_ms=last_success,
            guarded=guarded,
            send_at_ms=send_at_ms,
        )

    def _dispatch_all(self, queue: str, batch: list[Occurrence], sending: _Sending) -> None:
        """Send `batch`, whose leases end at `sending.deadline`; outcomes go to `sending`.

        An outcome is None (accepted), the error it failed with, `_LOST`: its lease expired
        while earlier ones were sent and another pump took it, so it was not sent, or
        `_UNSENT`: the pump was asked to stop and `STOP_GRACE_S` passed, so it was not sent.
        One at a time, the batch's leases (those sent, acked at the end, and those still to
        send) are extended whenever half the lease has passed since the claim, and what was
        sent is acked by a thread of its own (`SentAcker`) if a send blocks, so a slow
        send re-sends at most itself, not the rest of its batch, and a pump held before its
        first send sends none another pump took meanwhile. A batch dispatcher's batch is one
        send, always finished, after the same check of its leases.
        """
        if not batch:
            return
        if isinstance(self.dispatcher, BatchDispatcher) and getattr(
            self.dispatcher, "batch_at_once", True
        ):
            self._dispatch_batch(self.dispatcher, queue, batch, sending)
            return
        outcomes = sending.outcomes
        deadline = sending.deadline
        # From the claim, not the first send: a stall before it (a listener, a GC pause, a
        # frozen process) past half the lease is caught before anything is sent.
        started = last = sending.begun
        acker = None
        if len(batch) > 1:
            acker = SentAcker(
                self.repeat,
                queue,
                batch,
                outcomes,
                deadline_ms=deadline,
                written_at=started,
                lease_ms=self.lease_ms,
                released_ms=sending.released_ms,
            )
        held: set[str] | None = None
        stopping_since: float | None = None
        late: list[Occurrence] = []  # accepted after their leases expired (`on_sent_late`)
        late_s = 0.0
        try:
            for index, occurrence in enumerate(batch):
                if self._stop.is_set():
                    stopping_since = stopping_since or time.monotonic()
                    if time.monotonic() - stopping_since >= STOP_GRACE_S:
                        outcomes.extend([_UNSENT] * (len(batch) - index))
                        return
                if time.monotonic() - last > self.lease_ms / 2000:
                    with acker.lock if acker is not None else nullcontext():
                        last = time.monotonic()
                        # A full lease from now on: the deadline moves by the time that passed.
                        new_deadline = deadline + round((last - started) * 1000)
                        # Those sent too: they are acked with the batch, at its end.
                        sent = zip(batch[:index], outcomes, strict=True)
                        ours = [o.lease_member for o, outcome in sent if outcome is not _LOST]
                        ours += [o.lease_member for o in batch[index:]]
                        held = self.repeat.extend(queue, ours, deadline, new_deadline)
                        deadline, started = new_deadline, last
                        sending.deadline = deadline
                        if acker is not None:
                            acker.renewed(deadline, last)
                if held is not None and occurrence.lease_member not in held:
                    outcomes.append(_LOST)
                    continue
                self.sending = True
                try:
                    self.dispatcher.dispatch(occurrence)
                except BrokerUnreachable as exc:
                    # The next send would wait out the same timeout: the rest fail untried,
                    # their leases kept (sent again when they expire).
                    untried = BrokerUnreachable(f"not tried, the broker unreachable: {exc}")
                    outcomes.append(exc)
                    outcomes.extend([untried] * (len(batch) - index - 1))
                    return
                except Exception as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
                    # Its lease ran from the claim or the last extension (`started`).
                    if (behind := time.monotonic() - started - self.lease_ms / 1000) > 0:
                        late.append(occurrence)
                        late_s = max(late_s, behind)
                finally:
                    self.sending = False
        finally:
            if acker is not None:
                acker.stop()
            if late:
                self.events.on_sent_late(queue, late, late_s)

    def _dispatch_batch(
        self, dispatcher: BatchDispatcher, queue: str, batch: list[Occurrence], sending: _Sending
    ) -> None:
        """Send `batch` through the dispatcher's `dispatch_batch`, as one send.

        As the first send of a batch sent one at a time, it is preceded by a check of the
        leases when half the lease has passed since the claim (a slow server or a pause
        between the claim's clock and now): those another pump took since are not sent
        (`_LOST`), and the rest hold a full lease again.
        """
        outcomes = sending.outcomes
        mine = batch
        # When (monotonic) the leases expire, about: the claim's lease, or a full one from
        # the extension below.
        lease_s = self.lease_ms / 1000
        expires_at = sending.begun + lease_s
        elapsed_s = time.monotonic() - sending.begun
        if elapsed_s > self.lease_ms / 2000:
            new_deadline = sending.deadline + round(elapsed_s * 1000)
            held = self.repeat.extend(
                queue, [o.lease_member for o in batch], sending.deadline, new_deadline
            )
            sending.deadline = new_deadline
            expires_at = sending.begun + elapsed_s + lease_s
            mine = [o for o in batch if o.lease_member in held]
        self.sending = True
        try:
            results: Sequence[BaseException | None] = (
                dispatcher.dispatch_batch(mine) if mine else []
            )
        except Exception as exc:  # the adapter failed as a whole: none was accepted
            # Nothing says the registrations are at fault: retried, never parked.
            failure = batch_failure(exc) if isinstance(exc, PermanentDispatchError) else exc
            results = [failure] * len(mine)
        finally:
            self.sending = False
        late_s = time.monotonic() - expires_at
        if late_s > 0:
            self._sent_late(queue, mine, results, late_s)
        if mine is batch:
            outcomes.extend(results)
            return
        sent = iter(results)
        kept = {o.lease_member for o in mine}
        outcomes.extend(next(sent) if o.lease_member in kept else _LOST for o in batch)

    def _sent_late(
        self,
        queue: str,
        occurrences: Sequence[Occurrence],
        outcomes: Sequence[BaseException | None],
        late_s: float,
    ) -> None:
        """Tell of the occurrences a broker accepted after their leases expired: no check can
        fence a send the process was held in (another pump may have re-sent them)."""
        accepted = [o for o, outcome in zip(occurrences, outcomes, strict=False) if outcome is None]
        if accepted:
            self.events.on_sent_late(queue, accepted, late_s)

    # -- the loop -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` (or the tick in progress) to settle the batch in hand and return.

        A batch dispatcher's batch is one send and is finished; one sent an occurrence at a
        time goes on for `STOP_GRACE_S`, then the leases of what is left are handed back
        (another pump sends them at its next tick, same id, marked redelivered). Nothing
        more is claimed: what is due stays due for the other pumps.
        """
        self._stop.set()

    def run(self, stop: threading.Event | None = None) -> None:
        """Pump until `stop` (or `self.stop()`) is set.

        Sleeps until the earliest next run, or until a registry change is published, at most
        `max_sleep_s`. Redis outages are reported once and retried with backoff. On return
        the acks that failed and were not retried yet are tried once more (never raising),
        and the pump's heartbeat is removed (a pump that dies is forgotten when it expires).
        """
        if stop is not None:
            self._stop = stop
        try:
            while not self._stop.is_set():
                self.listen()
                _, delay = self.step()
                self.sleep(delay)
        finally:
            self.unlisten()
        self._retry_acks_at_stop()
        self.heartbeat.remove(self.repeat)

    def _retry_acks_at_stop(self) -> None:
        """Try each failed ack once more, whatever the clock: the fence alone makes it safe
        (a lease still at its deadline is this pump's, expired or not; one another pump
        re-took stays). What fails again is logged in one line; its leases expire."""
        left = 0
        failure: Exception | None = None
        for queue, pending in self._pending_acks.items():
            while pending and failure is None:
                try:
                    self._ack_again(queue, pending[0])
                except Exception as exc:  # never raised from a stop; Redis may be gone
                    failure = exc
                    break
                pending.pop(0)
            left += sum(len(ack.accepted) for ack in pending)
        self._pending_acks.clear()
        if failure is not None:
            log.warning(
                "stopping: %d sent occurrence(s) could not be acked; they may be sent again "
                "(same ids, marked redelivered) once their leases expire: %s",
                left,
                failure,
            )

    def step(self, stop: threading.Event | None = None) -> tuple[Tick | None, float]:
        """Run one tick as `run` does, errors handled; return it and the seconds to sleep.

        An outage is reported once, then its end once, and retried with backoff (the tick
        is None). A queue whose moves fail is reported once (a cluster that keeps
        redirecting, once per spell) and served no more in the tick's pipeline of scans: it
        is retried on its own, after the others, once a second (`BROKEN_RETRY_S`), while the
        other queues are served; once it succeeds it is told recovered and rejoins them.
        While an ack that failed can still be made (its leases not expired), the sleep is at
        most a second, outage or not. For loops owned by someone else, such as Celery's beat.
        With `stop`, setting it (or calling `self.stop()`) ends this tick as `stop()` says.
        A tick also writes the pump's heartbeat (`self.heartbeat`), at most every few seconds.
        """
        if stop is not None:
            self._stop = stop
        self._watch_eviction_policy()  # here, so that beat's loop watches it as `run` does
        began = time.monotonic()
        if self._outage_since is not None:  # the tick that finds Redis again holds them too
            self._lost_held_until = began + LOST_GRACE_S
        try:
            now_ms = self._clock_now()
            at_ms = now_ms if now_ms is not None else _monotonic_ms()
            due = [q for q, broken in self._broken.items() if broken.retry_ms <= at_ms]
            tick, errors, retried = self._tick(
                now_ms, TICK_BUDGET_S, left_out=self._broken.keys(), alone=due
            )
        except RegistryUnavailable as exc:
            if self._outage_since is None:
                # From the start of the tick that failed: a server that hangs (no answer, no
                # refusal) fails it only once the socket timeout passes, 30 s later.
                self._outage_since = began
                self.events.on_outage_begin(exc)
            self._failures += 1
            return None, self._ack_retry_delay(min(5.0, 0.05 * 2**self._failures))
        if self._outage_since is not None:
            self.events.on_outage_end(time.monotonic() - self._outage_since)
            self._outage_since, self._failures = None, 0
        self._broken = self._report_broken(errors, retried, at_ms)
        self.events.on_tick(tick)
        self.heartbeat.tick(
            self.repeat,
            tick.now_ms,
            len(tick.dispatched),
            len(tick.failed),
            sent=tick.dispatched,
            refused=tick.failed,
        )
        delay = self._ack_retry_delay(self._delay(tick))
        if self._broken:  # wake for the first retry due (at most `BROKEN_RETRY_S` away)
            retry_ms = min(broken.retry_ms for broken in self._broken.values())
            # From the tick's start: a retry that met redirections took a while itself.
            due_s = (retry_ms - at_ms) / 1000 - (time.monotonic() - began)
            delay = min(delay, max(0.0, due_s))
        return tick, delay

    @property
    def in_outage(self) -> bool:
        """Whether Redis was unreachable at the last tick (the outage's end not seen yet)."""
        return self._outage_since is not None

    def _ack_retry_delay(self, delay_s: float) -> float:
        """`delay_s`, at most `BROKEN_RETRY_S` while a failed ack's leases last (about), so
        it is tried again long before they expire."""
        now = time.monotonic()
        acks = (ack for pending in self._pending_acks.values() for ack in pending)
        if any(ack.expires_at > now for ack in acks):
            return min(delay_s, BROKEN_RETRY_S)
        return delay_s

    def _report_broken(
        self, errors: Mapping[str, RegistryError], retried: Collection[str], at_ms: int
    ) -> dict[str, _Broken]:
        """Report a failing queue once (again only if its error changes; a cluster that kept
        redirecting, once per spell) and its recovery (a queue of `retried` with no error
        now); return the queues broken from now on, each with when it is retried. A broken
        queue not retried this tick stays as it was."""
        was = self._broken
        broken = {queue: state for queue, state in was.items() if queue not in retried}
        for queue in retried:
            if queue not in errors:
                self.events.on_queue_recover(queue)
        retry_ms = at_ms + round(BROKEN_RETRY_S * 1000)
        for queue, exc in errors.items():
            told = None if isinstance(exc, RegistryRedirected) else str(exc)
            before = was.get(queue)
            if before is None or before.told != told:
                self.events.on_queue_error(queue, exc)
            broken[queue] = _Broken(told, retry_ms)
        return broken

    def _delay(self, tick: Tick) -> float:
        if tick.next_wake_ms is None:
            return self.max_sleep_s
        return min(self.max_sleep_s, max(0.0, (tick.next_wake_ms - tick.now_ms) / 1000))

    def _subscribe(self) -> WakeSubscription | None:
        try:
            return self.repeat.subscribe(self.queues)
        except WakeupsRefused as exc:
            self._refuse_wakeups(exc)
            return None
        except RegistryError as exc:
            log.debug("no wake-up subscription, polling every %.1fs: %s", self.max_sleep_s, exc)
            return None

    def _refuse_wakeups(self, exc: WakeupsRefused) -> None:
        """Poll from now on, told once: the server refuses the subscription, and asking at
        every tick would make each sleep end at once (a busy loop)."""
        self.unlisten()
        if not self._wakeups_refused:
            self._wakeups_refused = True
            log.warning(
                "wake-ups are off, the pump polls every %.1fs: %s (give the user the "
                "channels `&%s:*`)",
                self.max_sleep_s,
                exc,
                self.repeat.prefix,
            )

    def listen(self) -> None:
        """Subscribe to the wake-ups of the pump's queues, unless subscribed: a loop calls it
        before each `step`, so that a change published while the step runs ends the `sleep`
        after it. Without a subscription (Redis unreachable, or the user refused it), `sleep`
        polls."""
        if self._wakeups is None and not self._wakeups_refused:
            self._wakeups = self._subscribe()
            self._listened_at = time.monotonic()

    def sleep(self, delay_s: float) -> None:
        """Sleep up to `delay_s`: until a registry change of the pump's queues is published
        (`listen`), or `stop()`. During an outage the subscription is dropped (its connection
        is dead too); the next `listen` makes a new one."""
        if self._outage_since is not None:
            self.unlisten()
        deadline = time.monotonic() + delay_s
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            wakeups = self._wakeups
            if wakeups is None:
                self._stop.wait(min(remaining, 0.2))
                continue
            try:
                if wakeups.wait(min(remaining, 0.2)):
                    return  # a registry change: tick now
            except WakeupsRefused as exc:
                self._refuse_wakeups(exc)
            except Exception as exc:  # the connection broke: a new one comes at `listen`
                interrupt = _interrupt_behind(exc)
                if interrupt is not None:
                    raise interrupt from None
                self.unlisten()
                if time.monotonic() - self._listened_at >= RESUBSCRIBE_S:
                    return  # tick now: a change may have come meanwhile
                # Broken as soon as it was made: poll out this sleep, so that a subscription
                # that always breaks makes no busy loop.

    def unlisten(self) -> None:
        """Close the wake-up subscription, if any; never raises."""
        wakeups, self._wakeups = self._wakeups, None
        if wakeups is not None:
            wakeups.close()

    def check_eviction_policy(self) -> str | None:
        """Warn loudly if Redis may evict registry keys (see `Repeat.check_eviction_policy`).

        Warns once per policy: a pump that checks again only warns when it changed.
        """
        self._policy_read_at = time.monotonic()
        self._policy = self.repeat.check_eviction_policy(self._policy)
        return self._policy

    def _watch_eviction_policy(self) -> None:
        """Read the policy at start, then every `eviction_check_s`: it can change at runtime."""
        read_at = self._policy_read_at
        if read_at is None or time.monotonic() - read_at >= self.eviction_check_s:
            self.check_eviction_policy()


def _nominal_step(cadence: Cadence, step: CatchUp, immediate_ms: int | None) -> CatchUp:
    """`step` with its slots told as nominal times: a jittered cadence's scores are the
    jittered instants, but the log and the listeners name slots, as occurrences do (the
    `immediately` run, at `immediate_ms`, is its own: `nominal_slot`)."""
    if not isinstance(cadence, Jittered):
        return step
    fire = step.fire_ms
    return replace(
        step,
        fire_ms=None if fire is None else nominal_slot(cadence, fire, immediate_ms),
        first_ms=nominal_slot(cadence, step.first_ms, immediate_ms),
        last_ms=nominal_slot(cadence, step.last_ms, immediate_ms),
    )


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """Return the `SystemExit` or `KeyboardInterrupt` that `exc` replaced, if any.

    A signal handler raising one while the sleep reads its subscription (Celery's beat
    stop handler, which closes that subscription first) unwinds through redis-py, whose
    `finally` clauses before 8.2 then fail on the closed connection (`ValueError: I/O
    operation on closed file`): that error replaces the exit, which must go on.
    """
    seen: set[int] = set()
    cause = exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, SystemExit | KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


def _idle(scan: Scan) -> bool:
    """Whether a scan found nothing to do: nothing due, no expired lease, nothing lost."""
    return not (scan.due or scan.expired or scan.lost)


def _last_runs(
    decoded: Mapping[str, _Firing | None], records: Mapping[str, Mapping[str, str]]
) -> dict[str, int]:
    """Return the last run of each due registration whose cadence is checked (a Celery
    `is_due`: its score was a check, which needs the last run), from the batch's records;
    other cadences need none. A record is created before it fires."""
    runs: dict[str, int] = {}
    for name, firing in decoded.items():
        if firing is None or not hasattr(firing.cadence, "check"):
            continue
        fields = records.get(name, {})
        known = [int(v) for f in LAST_RUN_FIELDS if (v := fields.get(f, "")).isdigit()]
        if known:
            runs[name] = max(known)
    return runs


def _not_utf8(member: bytes) -> bool:
    try:
        member.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
