"""Pump events: the one place where a pump tells what it did.

`PumpEvents` has one no-op method per event, in the spirit of Dramatiq's `Middleware`:
subclass it, override what you need, and hand it to `Pump(listeners=[...])` (or
`pump.add_listener`). Logging is one such listener (`LoggingEvents`, always installed);
metrics, run history and the web view hang here too, without touching the pump.

Listeners run on the pump's thread, in order, synchronously: keep them quick. An
exception from a listener is logged (once per listener and event) and never stops the
pump or the other listeners.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .cadence import NEVER_MS, CatchUp
from .errors import RegistryOutOfMemory, RegistryRedirected
from .occurrence import Occurrence
from .outcome import Report

__all__ = [
    "Broadcast",
    "LoggingEvents",
    "OutcomeEvents",
    "PumpEvents",
    "Tick",
    "add_outcome_listener",
    "outcome_listeners",
    "remove_outcome_listener",
]

log = logging.getLogger("emq_bridge.pump")


@dataclass(slots=True)
class Tick:
    """What one tick of a pump did, over all its queues."""

    now_ms: int = 0
    dispatched: list[Occurrence] = field(default_factory=list)
    failed: list[Occurrence] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    next_wake_ms: int | None = None

    def wake_at(self, at_ms: int | None) -> None:
        if at_ms is not None and (self.next_wake_ms is None or at_ms < self.next_wake_ms):
            self.next_wake_ms = at_ms


class PumpEvents:
    """What a pump reports. Every method is a no-op; override the ones you need."""

    def on_tick(self, tick: Tick) -> None:
        """A tick over every queue finished (also when nothing was due)."""

    def on_claim(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        """The pump claimed `occurrences` (leased, scores moved) and is about to send them."""

    def on_redispatch(self, occurrence: Occurrence) -> None:
        """`occurrence`'s lease expired unacked: it is sent again, with the same id."""

    def on_dispatch(self, occurrence: Occurrence) -> None:
        """The broker accepted `occurrence`; its lease is about to be dropped."""

    def on_dispatch_failure(self, occurrence: Occurrence, error: BaseException) -> None:
        """Sending `occurrence` failed; its lease stays, and it is re-sent when it expires."""

    def on_lease_lost(self, occurrence: Occurrence) -> None:
        """`occurrence` was not sent: its lease expired while earlier ones of its batch were
        sent, and another pump took it (and sends it)."""

    def on_registration_failed(self, occurrence: Occurrence, error: BaseException) -> None:
        """`occurrence` can never be sent (`PermanentDispatchError`: an unknown task or actor,
        a template the framework refuses): its lease is dropped and its registration is
        parked, with `error` as the reason, until it is resumed."""

    def on_hand_back(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        """The pump stopped (or was interrupted) before it sent `occurrences`: their leases
        expire at once, and the next tick of any pump sends them (same ids, redelivered)."""

    def on_sent_late(self, queue: str, occurrences: Sequence[Occurrence], late_s: float) -> None:
        """The broker accepted `occurrences` `late_s` seconds after their leases expired (a
        send that outlasted the lease: a slow broker, or this process held mid-send, past
        the lease check before it): another pump may have sent them too, with the same ids,
        its copies marked redelivered; these copies are not marked."""

    def on_missed(self, queue: str, name: str, missed: int, due_ms: int) -> None:
        """`missed` slots of `name` no pump claimed in time (stopped, or behind); the policy
        dropped them.

        `due_ms` is the nominal time of the occurrence that fires for them, or the next run
        when none fires (`skip`, or every slot older than the catch-up window; `NEVER_MS`
        of `emq_bridge.cadence` when it has no run left: a one-off or `end_at` passed). Told with
        `on_catch_up`, once per registration per outage, by the pump whose claim counted them.
        """

    def on_catch_up(self, queue: str, name: str, step: CatchUp) -> None:
        """The misfire policy of `name` dropped `step.missed` of the `step.passed` slots that
        passed (`step.first_ms` to `step.last_ms`) and fires `step.fire_ms` (None: none)."""

    def on_park(self, queue: str, name: str, reason: str, park_ms: int) -> None:
        """The record of `name` cannot be used (`reason`): it is parked for `park_ms`."""

    def on_lease_dropped(self, queue: str, member: str, reason: str) -> None:
        """An expired lease was dropped without a re-send (its registration is gone or it is
        garbage)."""

    def on_skip(self, queue: str, name: str, due_ms: int) -> None:
        """The slot `due_ms` of `name` was not sent: an occurrence of it is in flight and its
        overlap policy is `skip` (or `buffer_one` with one kept already). Counted `skipped`."""

    def on_buffer(self, queue: str, name: str, due_ms: int) -> None:
        """The slot `due_ms` of `name` waits (`buffer_one`): it is sent when the occurrence
        in flight ends."""

    def on_replace(self, occurrence: Occurrence, previous_id: str, revoked: bool) -> None:
        """`occurrence` replaces `previous_id`, in flight (overlap `replace`: once for each
        occurrence in flight); `revoked` says whether the dispatcher could revoke it."""

    def on_lost(self, queue: str, name: str, due_ms: int, occurrence_id: str) -> None:
        """The occurrence `occurrence_id` in flight went silent (its worker stopped
        heartbeating, or no worker reported its start in time): it is marked `lost`."""

    def on_outage_begin(self, error: BaseException) -> None:
        """Redis became unreachable; the pump retries with backoff."""

    def on_outage_end(self, seconds: float) -> None:
        """Redis is reachable again after `seconds`."""

    def on_queue_error(self, queue: str, error: BaseException) -> None:
        """A registry move of `queue` failed (not an outage); the other queues are served.

        Reported once per distinct error, not on every retry; a Redis Cluster that kept
        redirecting (`RegistryRedirected`: a slot migrating or failing over) once per spell.
        """

    def on_queue_recover(self, queue: str) -> None:
        """The registry moves of `queue` succeed again."""


def _when(ms: int) -> str:
    if ms >= NEVER_MS:  # no run left (past a one-off's instants or its end_at)
        return "never"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def _cause(error: BaseException) -> str:
    """Return `Type: message` of `error`, plus each error of its `__cause__` chain whose
    message the line does not tell yet (kombu's `BatchPublishError` says the batch failed,
    and only its cause, a connection error, says why)."""
    text = f"{type(error).__name__}: {error}"
    link, seen = error.__cause__, {id(error)}
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        told = str(link) in text or (
            isinstance(link, OSError) and bool(link.strerror) and str(link.strerror) in text
        )
        if not told:
            text += f" (caused by {type(link).__name__}: {link})"
        link = link.__cause__
    return text


# Per-registration lines of one kind a tick logs at their level (a missed-slot WARNING, a
# failed send's ERROR): the rest go to DEBUG, and one line at the end of the tick counts them.
# A tick after an outage tells thousands of registrations at once; a worker whose log is a
# pipe nobody reads yet (Dramatiq's parent, until all its processes are ready) would block.
SHOWN_PER_TICK = 5
# The queues a summary line names, at most.
_QUEUES_NAMED = 5


@dataclass(slots=True)
class _Held:
    """The lines of one kind a tick logged at DEBUG only, for its summary line."""

    level: int
    count: int = 0
    slots: int = 0  # the missed slots they tell (missed-slot lines only)
    queues: set[str] = field(default_factory=set)


# What the summary line says of each kind's held lines ("N more <what>").
_HELD_WHAT = {
    "catch_up": "registration(s) missed slots no pump claimed in time",
    "skip": "slot(s) skipped: an occurrence is in flight",
    "buffer": "slot(s) wait for the occurrence in flight to end",
    "redispatch": "occurrence(s) sent again with the same id after their lease expired",
    "lease_lost": "occurrence(s) not sent by this pump: another pump took their lease",
    "dispatch_failure": "dispatch(es) failed; each is retried after its lease",
    "registration_failed": "registration(s) parked until resumed: an occurrence cannot be sent",
    "replace": "occurrence(s) replace one still in flight",
    "lost": "occurrence(s) lost: no worker started them in time, or theirs stopped reporting",
    "park": "registration(s) parked: their record cannot be used",
    "lease_dropped": "lease(s) dropped without a re-send",
}


class LoggingEvents(PumpEvents):
    """The pump's log lines, under the `emq_bridge.pump` logger.

    A failed send is one ERROR line each, with its cause. Its traceback (the broker's error
    chained under a `DispatchError`, often 70 lines and more) is logged at DEBUG only, with
    the first failure of each type of error until a tick sends something again, so a broker
    that refuses every send does not log a traceback per occurrence and per lease.

    Of the lines a tick logs per registration or occurrence (missed slots, failed sends,
    re-sends, parks...), the first `SHOWN_PER_TICK` of each kind are logged at their level
    and the rest at DEBUG; the end of the tick then logs one line per kind at that level:
    `N more <what> (listed at DEBUG)`.
    """

    def __init__(self) -> None:
        self._traced: set[type[BaseException]] = set()
        self._shown: dict[str, int] = {}  # lines logged at their level this tick, per kind
        self._held: dict[str, _Held] = {}  # lines logged at DEBUG instead, per kind

    def _level(self, kind: str, level: int, queue: str, slots: int = 0) -> int:
        """The level of this tick's next `kind` line: `level` for the first few, else DEBUG
        (counted for the tick's summary line)."""
        shown = self._shown.get(kind, 0)
        if shown < SHOWN_PER_TICK:
            self._shown[kind] = shown + 1
            return level
        held = self._held.get(kind)
        if held is None:
            held = self._held[kind] = _Held(level)
        held.count += 1
        held.slots += slots
        held.queues.add(queue)
        return logging.DEBUG

    def _summarize(self) -> None:
        """Log one line per kind of what this tick held at DEBUG, and start counting again."""
        held, self._held = self._held, {}
        self._shown.clear()
        for kind, each in held.items():
            slots = f" ({each.slots} slot(s), counted in missed)" if kind == "catch_up" else ""
            queues = sorted(each.queues)
            named = ", ".join(queues[:_QUEUES_NAMED])
            if len(queues) > _QUEUES_NAMED:
                named += f" and {len(queues) - _QUEUES_NAMED} more"
            log.log(
                each.level,
                "%d more %s%s, in queue(s) %s (listed at DEBUG)",
                each.count,
                _HELD_WHAT[kind],
                slots,
                named,
            )

    def on_tick(self, tick: Tick) -> None:
        if self._shown:
            self._summarize()
        if self._traced and tick.dispatched:
            self._traced.clear()

    def on_redispatch(self, occurrence: Occurrence) -> None:
        level = self._level("redispatch", logging.WARNING, occurrence.queue)
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "%s/%s: occurrence %s (due %s) was not acked before its lease expired (or a "
            "stopping pump handed it back); sending it again with the same id",
            occurrence.queue,
            occurrence.name,
            occurrence.id,
            _when(occurrence.due_ms),
        )

    def on_dispatch_failure(self, occurrence: Occurrence, error: BaseException) -> None:
        level = self._level("dispatch_failure", logging.ERROR, occurrence.queue)
        if log.isEnabledFor(level):
            log.log(
                level,
                "%s/%s: dispatch of occurrence %s failed; it is retried after the lease: %s",
                occurrence.queue,
                occurrence.name,
                occurrence.id,
                _cause(error),
            )
        kind = type(error)
        if kind not in self._traced and log.isEnabledFor(logging.DEBUG):
            self._traced.add(kind)
            log.debug(
                "%s/%s: traceback of the failed dispatch of occurrence %s",
                occurrence.queue,
                occurrence.name,
                occurrence.id,
                exc_info=error,
            )

    def on_lease_lost(self, occurrence: Occurrence) -> None:
        level = self._level("lease_lost", logging.WARNING, occurrence.queue)
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "%s/%s: occurrence %s not sent by this pump: its lease expired while the batch was "
            "being sent, and another pump took it",
            occurrence.queue,
            occurrence.name,
            occurrence.id,
        )

    def on_skip(self, queue: str, name: str, due_ms: int) -> None:
        level = self._level("skip", logging.INFO, queue)
        if log.isEnabledFor(level):
            log.log(
                level,
                "%s/%s: slot %s skipped: an occurrence is in flight",
                queue,
                name,
                _when(due_ms),
            )

    def on_buffer(self, queue: str, name: str, due_ms: int) -> None:
        level = self._level("buffer", logging.INFO, queue)
        if log.isEnabledFor(level):
            log.log(
                level,
                "%s/%s: slot %s waits for the occurrence in flight to end",
                queue,
                name,
                _when(due_ms),
            )

    def on_replace(self, occurrence: Occurrence, previous_id: str, revoked: bool) -> None:
        level = self._level("replace", logging.WARNING, occurrence.queue)
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "%s/%s: occurrence %s replaces %s, still in flight%s",
            occurrence.queue,
            occurrence.name,
            occurrence.id,
            previous_id,
            " (revoked)" if revoked else "; this framework cannot revoke it, so it runs on",
        )

    def on_lost(self, queue: str, name: str, due_ms: int, occurrence_id: str) -> None:
        level = self._level("lost", logging.WARNING, queue)
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "%s/%s: occurrence %s (due %s) is lost: its worker stopped reporting (killed, or "
            "its heartbeats no longer reach Redis), or no worker started it in time (the start "
            "timeout: a message purged or lost in the broker)",
            queue,
            name,
            occurrence_id,
            _when(due_ms),
        )

    def on_registration_failed(self, occurrence: Occurrence, error: BaseException) -> None:
        level = self._level("registration_failed", logging.ERROR, occurrence.queue)
        if not log.isEnabledFor(level):
            return
        where = f"{occurrence.queue}/{occurrence.name}"
        log.log(
            level,
            "%s: parked, it fires no more until resumed (emq-bridge resume %s %s): "
            "occurrence %s can never be sent: %s",
            where,
            occurrence.queue,
            occurrence.name,
            occurrence.id,
            str(error).removeprefix(f"{where}: "),
        )

    def on_hand_back(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        log.warning(
            "%s: stopping: %d claimed occurrence(s) not sent handed back; the next pump tick "
            "sends them with the same ids",
            queue,
            len(occurrences),
        )

    def on_sent_late(self, queue: str, occurrences: Sequence[Occurrence], late_s: float) -> None:
        shown = ", ".join(f"{o.name} {o.id}" for o in occurrences[:3])
        more = f" and {len(occurrences) - 3} more" if len(occurrences) > 3 else ""
        log.warning(
            "%s: %d occurrence(s) reached the broker %.1fs after their leases expired (a slow "
            "broker, or this process was held mid-send): another pump may have sent them too, "
            "same ids, its copies marked redelivered, these not: %s%s",
            queue,
            len(occurrences),
            late_s,
            shown,
            more,
        )

    def on_catch_up(self, queue: str, name: str, step: CatchUp) -> None:
        level = self._level("catch_up", logging.WARNING, queue, step.missed)
        if not log.isEnabledFor(level):
            return
        if step.fire_ms is None and step.next_ms >= NEVER_MS:
            fired = "none fires; it has no run left"
        elif step.fire_ms is None:
            fired = f"none fires; next run {_when(step.next_ms)}"
        else:
            fired = f"fires the one due at {_when(step.fire_ms)}"
        log.log(
            level,
            "%s/%s: %d slot(s) missed, unclaimed in time (%d passed, %s to %s); misfire policy "
            "%s %s; counted in missed",
            queue,
            name,
            step.missed,
            step.passed,
            _when(step.first_ms),
            _when(step.last_ms),
            step.policy,
            fired,
        )

    def on_park(self, queue: str, name: str, reason: str, park_ms: int) -> None:
        level = self._level("park", logging.ERROR, queue)
        if log.isEnabledFor(level):
            log.log(level, "%s/%s: parked for %ds: %s", queue, name, park_ms // 1000, reason)

    def on_lease_dropped(self, queue: str, member: str, reason: str) -> None:
        level = self._level("lease_dropped", logging.ERROR, queue)
        if log.isEnabledFor(level):
            log.log(level, "%s: lease %r dropped: %s", queue, member, reason)

    def on_outage_begin(self, error: BaseException) -> None:
        if self._shown:  # the tick that failed ends here: it gets no `on_tick`
            self._summarize()
        if isinstance(error, RegistryOutOfMemory):
            log.error(
                "Redis is out of memory and refuses writes; retrying with backoff until it "
                "takes them again (nothing is marked lost meanwhile): %s",
                error,
            )
            return
        log.error("Redis is unreachable; retrying with backoff until it is back: %s", error)

    def on_outage_end(self, seconds: float) -> None:
        log.warning("Redis is reachable again after %.1fs; pumping resumes", seconds)

    def on_queue_error(self, queue: str, error: BaseException) -> None:
        # A reshard or a failover under way is no broken registry: it passes by itself.
        redirected = isinstance(error, RegistryRedirected)
        log.log(
            logging.WARNING if redirected else logging.ERROR,
            "%s: a registry move %s; the other queues are served, this one is retried every "
            "second: %s",
            queue,
            "is held up by a Redis Cluster slot on the move" if redirected else "failed",
            error,
        )

    def on_queue_recover(self, queue: str) -> None:
        log.warning("%s: registry moves succeed again; pumping resumes", queue)


class Broadcast(PumpEvents):
    """Calls each listener in turn; a listener that raises is logged once and skipped."""

    def __init__(self, listeners: Iterable[PumpEvents] = ()) -> None:
        self.listeners: list[PumpEvents] = list(listeners)
        self._reported: set[tuple[int, str]] = set()

    def add(self, listener: PumpEvents) -> None:
        self.listeners.append(listener)

    def _failed(self, listener: PumpEvents, event: str, exc: Exception) -> None:
        key = (id(listener), event)
        if key not in self._reported:  # once: a broken listener would flood the log
            self._reported.add(key)
            log.error(
                "pump listener %s failed in %s (reported once; the pump goes on)",
                type(listener).__name__,
                event,
                exc_info=exc,
            )

    def _each(self, event: str, call: Callable[[PumpEvents], None]) -> None:
        for listener in self.listeners:
            try:
                call(listener)
            except Exception as exc:
                self._failed(listener, event, exc)

    def on_tick(self, tick: Tick) -> None:
        self._each("on_tick", lambda listener: listener.on_tick(tick))

    def on_claim(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        self._each("on_claim", lambda listener: listener.on_claim(queue, occurrences))

    def on_redispatch(self, occurrence: Occurrence) -> None:
        self._each("on_redispatch", lambda listener: listener.on_redispatch(occurrence))

    def on_dispatch(self, occurrence: Occurrence) -> None:
        self._each("on_dispatch", lambda listener: listener.on_dispatch(occurrence))

    def on_dispatch_failure(self, occurrence: Occurrence, error: BaseException) -> None:
        self._each(
            "on_dispatch_failure", lambda listener: listener.on_dispatch_failure(occurrence, error)
        )

    def on_lease_lost(self, occurrence: Occurrence) -> None:
        self._each("on_lease_lost", lambda listener: listener.on_lease_lost(occurrence))

    def on_registration_failed(self, occurrence: Occurrence, error: BaseException) -> None:
        self._each(
            "on_registration_failed",
            lambda listener: listener.on_registration_failed(occurrence, error),
        )

    def on_hand_back(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        self._each("on_hand_back", lambda listener: listener.on_hand_back(queue, occurrences))

    def on_sent_late(self, queue: str, occurrences: Sequence[Occurrence], late_s: float) -> None:
        self._each(
            "on_sent_late", lambda listener: listener.on_sent_late(queue, occurrences, late_s)
        )

    def on_missed(self, queue: str, name: str, missed: int, due_ms: int) -> None:
        self._each("on_missed", lambda listener: listener.on_missed(queue, name, missed, due_ms))

    def on_catch_up(self, queue: str, name: str, step: CatchUp) -> None:
        self._each("on_catch_up", lambda listener: listener.on_catch_up(queue, name, step))

    def on_park(self, queue: str, name: str, reason: str, park_ms: int) -> None:
        self._each("on_park", lambda listener: listener.on_park(queue, name, reason, park_ms))

    def on_lease_dropped(self, queue: str, member: str, reason: str) -> None:
        self._each(
            "on_lease_dropped", lambda listener: listener.on_lease_dropped(queue, member, reason)
        )

    def on_skip(self, queue: str, name: str, due_ms: int) -> None:
        self._each("on_skip", lambda listener: listener.on_skip(queue, name, due_ms))

    def on_buffer(self, queue: str, name: str, due_ms: int) -> None:
        self._each("on_buffer", lambda listener: listener.on_buffer(queue, name, due_ms))

    def on_replace(self, occurrence: Occurrence, previous_id: str, revoked: bool) -> None:
        self._each(
            "on_replace", lambda listener: listener.on_replace(occurrence, previous_id, revoked)
        )

    def on_lost(self, queue: str, name: str, due_ms: int, occurrence_id: str) -> None:
        self._each("on_lost", lambda listener: listener.on_lost(queue, name, due_ms, occurrence_id))

    def on_outage_begin(self, error: BaseException) -> None:
        self._each("on_outage_begin", lambda listener: listener.on_outage_begin(error))

    def on_outage_end(self, seconds: float) -> None:
        self._each("on_outage_end", lambda listener: listener.on_outage_end(seconds))

    def on_queue_error(self, queue: str, error: BaseException) -> None:
        self._each("on_queue_error", lambda listener: listener.on_queue_error(queue, error))

    def on_queue_recover(self, queue: str) -> None:
        self._each("on_queue_recover", lambda listener: listener.on_queue_recover(queue))


# -- outcome events: what this process reports of occurrences ---------------------------------


class OutcomeEvents:
    """What a process reports of occurrences (its workers' `Report`s). A no-op; override it.

    Listeners are process-wide (`add_outcome_listener`), since the adapters build their
    reporters themselves; a forked child inherits them. `Repeat.report` calls them, on the
    reporter's thread (never the task's), before it applies the batch.
    """

    def on_reports(self, reports: Sequence[Report]) -> None:
        """`reports` are about to be sent to the registry (a batch; heartbeats included; a
        start folded into its final report is that report's `started_ms`)."""


class _OutcomeBroadcast(OutcomeEvents):
    """The process-wide outcome listeners; one that raises is logged once and skipped."""

    def __init__(self) -> None:
        self.listeners: tuple[OutcomeEvents, ...] = ()
        self._reported: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.listeners)

    def on_reports(self, reports: Sequence[Report]) -> None:
        for listener in self.listeners:
            try:
                listener.on_reports(reports)
            except Exception as exc:
                if id(listener) not in self._reported:
                    self._reported.add(id(listener))
                    log.error(
                        "outcome listener %s failed (reported once; reports go on)",
                        type(listener).__name__,
                        exc_info=exc,
                    )


outcome_listeners = _OutcomeBroadcast()


def add_outcome_listener(listener: OutcomeEvents) -> None:
    """Tell `listener` what this process reports from now on (once, however often added)."""
    if listener not in outcome_listeners.listeners:
        # A new tuple, not an append: the reporter thread iterates without a lock.
        outcome_listeners.listeners = (*outcome_listeners.listeners, listener)


def remove_outcome_listener(listener: OutcomeEvents) -> None:
    """Stop telling `listener` (nothing if it was not added)."""
    outcome_listeners.listeners = tuple(
        known for known in outcome_listeners.listeners if known is not listener
    )
