"""Recurring schedules declared on Dramatiq actors, and what an actor reads of its occurrence.

Part of `emq_bridge.dramatiq`, which re-exports the public names. A schedule is declared
on an actor in one of two ways:

* the `recurring(...)` decorator, stacked above `@dramatiq.actor` (several per actor);
* the `recurring=` actor option, `@dramatiq.actor(recurring=every("15m"))`, which
  Dramatiq accepts once a `RecurringMiddleware` is on the broker.

Either way the schedule becomes a `Declaration` of the actor's queue, named after the actor
unless `name=` says otherwise, whose template is `{"task", "args", "kwargs", "options"}`.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypeVar

import dramatiq
from dramatiq.middleware import CurrentMessage

from ..bounds import Instant
from ..cadence import Anchor, Misfire
from ..calendars import ExcludeItem
from ..definition import Declaration, Offset, Schedule, naming_schedule
from ..errors import ConfigError, ScheduleError
from ..registry import Registered, Repeat
from ..template import TaskTemplate
from .message_options import message_option_error

__all__ = [
    "OPTION_BACKFILL",
    "OPTION_DUE_MS",
    "OPTION_GUARDED",
    "OPTION_LAST_SUCCESS_MS",
    "OPTION_NAME",
    "OPTION_PREVIOUS_DUE_MS",
    "OPTION_QUEUE",
    "OPTION_REDELIVERED",
    "OPTION_RELEASED_MS",
    "OPTION_TRIGGERED",
    "RECURRING_OPTION",
    "OccurrenceInfo",
    "Schedule",
    "actor_declarations",
    "attempt_of",
    "broker_declarations",
    "check_actors",
    "check_overlap",
    "cron",
    "current_occurrence",
    "every",
    "occurrence_of",
    "recurring",
    "register",
]

# The actor option the middleware declares: `@dramatiq.actor(recurring=...)`.
RECURRING_OPTION = "recurring"
# Message options that carry an occurrence's identity to the actor.
OPTION_DUE_MS = "emq_due_ms"
OPTION_NAME = "emq_name"
OPTION_QUEUE = "emq_queue"
OPTION_REDELIVERED = "emq_redelivered"
OPTION_TRIGGERED = "emq_triggered"
OPTION_BACKFILL = "emq_backfill"  # sent by a backfill (backfill.py), for a past slot
# Set (true) on a slot of a registration with an overlap policy: the worker asks before it
# runs it (`Repeat.begin`); absent on any other message.
OPTION_GUARDED = "emq_guarded"
# ... and its previous-run context: when a pump claimed it (server clock), the slot fired
# before it and when an occurrence of it last succeeded (epoch ms, or None when unknown).
OPTION_RELEASED_MS = "emq_released_ms"
OPTION_PREVIOUS_DUE_MS = "emq_previous_due_ms"
OPTION_LAST_SUCCESS_MS = "emq_last_success_ms"

_DECORATED = "_emq_recurring"  # attribute on an Actor: the schedules its decorators declared
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("emq_bridge_message", default=None)

# The overlap policies Dramatiq can honour (not `replace`: `check_overlap`).
DramatiqOverlap = Literal["allow", "skip", "buffer_one"]
# What `@recurring` decorates: an actor (`@dramatiq.actor` below it), kept as it is typed.
ActorT = TypeVar("ActorT", bound="dramatiq.Actor[Any, Any]")


def every(
    interval: float | timedelta | str,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    name: str | None = None,
    anchor: Anchor = "grid",
    misfire: Misfire = "coalesce",
    overlap: DramatiqOverlap = "allow",
    pause_after_failures: int | None = None,
    catchup_window: float | timedelta | str | None = None,
    catchup_max: int | None = None,
    offset: Offset | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    limit: int | None = None,
    immediately: bool = False,
    jitter: float | timedelta | str | None = None,
    exclude: Sequence[ExcludeItem] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Schedule:
    """Return an interval schedule, e.g. `every("15m")`, for `@dramatiq.actor(recurring=...)`."""
    return dramatiq_schedule(
        every=interval,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        anchor=anchor,
        misfire=misfire,
        overlap=overlap,
        pause_after_failures=pause_after_failures,
        catchup_window=catchup_window,
        catchup_max=catchup_max,
        offset=offset,
        start_at=start_at,
        end_at=end_at,
        limit=limit,
        immediately=immediately,
        jitter=jitter,
        exclude=exclude,
        labels=labels,
    )


def cron(
    expression: str,
    *,
    tz: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    name: str | None = None,
    misfire: Misfire = "coalesce",
    overlap: DramatiqOverlap = "allow",
    pause_after_failures: int | None = None,
    catchup_window: float | timedelta | str | None = None,
    catchup_max: int | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    limit: int | None = None,
    immediately: bool = False,
    jitter: float | timedelta | str | None = None,
    exclude: Sequence[ExcludeItem] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Schedule:
    """Return a cron schedule in `tz` (IANA, default UTC), e.g. `cron("0 9 * * 1-5")`."""
    return dramatiq_schedule(
        cron=expression,
        tz=tz,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        misfire=misfire,
        overlap=overlap,
        pause_after_failures=pause_after_failures,
        catchup_window=catchup_window,
        catchup_max=catchup_max,
        start_at=start_at,
        end_at=end_at,
        limit=limit,
        immediately=immediately,
        jitter=jitter,
        exclude=exclude,
        labels=labels,
    )


def check_overlap(overlap: object, where: str = "") -> None:
    """Raise `ScheduleError` for `overlap="replace"`, which Dramatiq cannot honour.

    `replace` revokes the occurrence in flight, and Dramatiq has no way to stop a message
    that runs (nor one another worker holds). The other policies only decide whether a slot
    is sent, which the registry does on its own.
    """
    if overlap == "replace":
        raise ScheduleError(
            f"{where}overlap='replace' is not available on Dramatiq: it cannot revoke a message "
            "that runs; use overlap='skip' (drop the slots that come while one runs) or "
            "overlap='buffer_one' (keep one to run as soon as it ends)"
        )


def dramatiq_schedule(**fields: Any) -> Schedule:
    """Return `Schedule(**fields)`, refusing what Dramatiq cannot do (`check_overlap`, and
    message options its middleware cannot read: `message_option_error`)."""
    check_overlap(fields.get("overlap"))
    unusable = message_option_error(fields.get("options") or {})
    if unusable is not None:
        raise ScheduleError(unusable)
    return Schedule(**fields)


def recurring(
    *,
    every: float | timedelta | str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    name: str | None = None,
    anchor: Anchor = "grid",
    misfire: Misfire = "coalesce",
    overlap: DramatiqOverlap = "allow",
    pause_after_failures: int | None = None,
    catchup_window: float | timedelta | str | None = None,
    catchup_max: int | None = None,
    offset: Offset | None = None,
    at: Instant | Sequence[Instant] | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    limit: int | None = None,
    immediately: bool = False,
    jitter: float | timedelta | str | None = None,
    exclude: Sequence[ExcludeItem] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Callable[[ActorT], ActorT]:
    """Declare a recurring schedule on the actor below: stack it above `@dramatiq.actor`.

    `overlap` is `allow`, `skip` or `buffer_one` (not `replace`: Dramatiq cannot revoke a
    running message); `pause_after_failures=K` pauses the schedule after K consecutive
    failed occurrences. Both need the workers' reports (`RecurringMiddleware(report=True)`).
    `jitter` and `exclude` spread and skip slots (docs/cron.md); `labels` (str -> str) tag
    the registration (docs/schedules-and-cli.md).
    Raises `ScheduleError` at import time for an invalid cadence or policy, non-JSON
    arguments, message options Dramatiq's middleware cannot read (`max_retries="many"`), a
    decorator placed below `@dramatiq.actor`, or a name another schedule of the actor holds;
    with a `name`, an error of the schedule says `schedule 'name': ...` (they are checked
    here, before the actor they decorate is known).
    """
    with naming_schedule(name):
        schedule = dramatiq_schedule(
            every=every,
            cron=cron,
            tz=tz,
            args=args,
            kwargs=kwargs,
            options=options,
            name=name,
            anchor=anchor,
            misfire=misfire,
            overlap=overlap,
            pause_after_failures=pause_after_failures,
            catchup_window=catchup_window,
            catchup_max=catchup_max,
            offset=offset,
            at=at,
            start_at=start_at,
            end_at=end_at,
            limit=limit,
            immediately=immediately,
            jitter=jitter,
            exclude=exclude,
            labels=labels,
        )

    def attach(actor: ActorT) -> ActorT:
        if not isinstance(actor, dramatiq.Actor):
            raise ScheduleError(
                f"@recurring must be stacked above @dramatiq.actor (it got {actor!r}, not an actor)"
            )
        declared: tuple[Schedule, ...] = getattr(actor, _DECORATED, ())
        setattr(actor, _DECORATED, (*declared, schedule))
        try:
            actor_declarations(actor)
        except ScheduleError:
            setattr(actor, _DECORATED, declared)
            raise
        return actor

    return attach


def parse_option(value: object) -> list[Schedule]:
    """Return the schedules of a `recurring=` actor option; raise `ScheduleError` if malformed.

    Accepted: a `Schedule` (from `every(...)` or `cron(...)`), a dict of `Schedule`'s
    keyword arguments, or a list of those.
    """
    items: Iterable[object] = value if isinstance(value, (list, tuple)) else [value]
    schedules = []
    for item in items:
        if isinstance(item, Schedule):
            schedules.append(item)
        elif isinstance(item, Mapping):
            try:
                schedules.append(dramatiq_schedule(**item))
            except TypeError as exc:
                raise ScheduleError(f"recurring={dict(item)!r}: {exc}") from exc
        else:
            raise ScheduleError(
                f"recurring= takes every('15m'), cron('0 9 * * *'), a dict such as "
                f"{{'every': '15m'}} or a list of those; got {item!r}"
            )
    return schedules


def actor_declarations(actor: dramatiq.Actor[Any, Any]) -> list[Declaration]:
    """Return the declarations of `actor`: its `recurring=` option, then its decorators."""
    schedules = parse_option(actor.options.get(RECURRING_OPTION, []))
    schedules += getattr(actor, _DECORATED, ())
    found: dict[str, Declaration] = {}
    signature = _signature(actor) if schedules else None
    for schedule in schedules:
        check_overlap(schedule.overlap)  # a Schedule built directly
        declaration = schedule.bind(actor.actor_name, actor.queue_name)
        _check_arguments(actor, signature, schedule, declaration.name)
        if declaration.name in found:
            raise ScheduleError(
                f"actor {actor.actor_name!r} declares two schedules named {declaration.name!r}; "
                "give each schedule of one actor a distinct name="
            )
        found[declaration.name] = declaration
    return list(found.values())


def _check_arguments(
    actor: dramatiq.Actor[Any, Any],
    signature: inspect.Signature | None,
    schedule: Schedule,
    name: str,
) -> None:
    """Raise `ScheduleError` when the actor's function refuses the schedule's args and
    kwargs: Dramatiq sends any arguments, and the call refuses them in the worker, every
    run; said here, where the schedule is declared, instead."""
    if signature is None:
        return
    try:
        signature.bind(*schedule.args, **(schedule.kwargs or {}))
    except TypeError as exc:
        raise ScheduleError(
            f"schedule {name!r} of actor {actor.actor_name!r}: its args and kwargs do not "
            f"fit the actor: {exc}"
        ) from None


def _signature(actor: dramatiq.Actor[Any, Any]) -> inspect.Signature | None:
    """The signature the actor's function is called with; None when it has none to read."""
    try:
        return inspect.signature(actor.fn)
    except (TypeError, ValueError):  # a builtin or a callable with no signature
        return None


def broker_declarations(broker: dramatiq.Broker) -> tuple[Declaration, ...]:
    """Return every schedule declared on the actors of `broker`, in actor-name order."""
    found: dict[tuple[str, str], Declaration] = {}
    for actor_name in sorted(broker.actors):
        for declaration in actor_declarations(broker.actors[actor_name]):
            key = (declaration.queue, declaration.name)
            if key in found:
                raise ConfigError(
                    f"two actors declare the schedule {key[0]}/{key[1]}; give one a distinct name="
                )
            found[key] = declaration
    return tuple(found.values())


@dataclass(frozen=True, slots=True)
class OccurrenceInfo:
    """What an actor knows of the occurrence it serves: its id, registration and nominal time,
    and the previous-run context.

    `redelivered` is true when the occurrence was sent again after its lease expired (the
    pump that claimed it may have enqueued it already); `triggered` is true for a manual
    `trigger` (a fresh occurrence at the moment of the trigger). `released_ms` is when a pump
    claimed it (the server's clock); `previous_due_ms` the slot the registration fired before
    this one (None on its first run and on a re-send); `last_success_ms` when a worker last
    reported one of its occurrences succeeded (None if none has, or nothing reports). All
    are epoch ms; the properties without `_ms` are the same instants as aware UTC datetimes.
    `attempt` counts Dramatiq's retries of this message from 1. `backfill` is true when a
    backfill sent it for a past slot (the id is the one that slot has live).
    """

    id: str
    queue: str
    name: str
    due_ms: int
    redelivered: bool = False
    triggered: bool = False
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    released_ms: int | None = None
    previous_due_ms: int | None = None
    last_success_ms: int | None = None
    attempt: int = 1
    backfill: bool = False

    @property
    def due(self) -> datetime:
        """The nominal instant of this occurrence, as an aware UTC datetime."""
        return _utc(self.due_ms)

    @property
    def released(self) -> datetime | None:
        """When a pump claimed this occurrence, or None if the message does not say."""
        return None if self.released_ms is None else _utc(self.released_ms)

    @property
    def previous_due(self) -> datetime | None:
        """The slot fired before this one, or None (first run, re-send, or not known)."""
        return None if self.previous_due_ms is None else _utc(self.previous_due_ms)

    @property
    def last_success(self) -> datetime | None:
        """When an occurrence of this registration last succeeded, or None."""
        return None if self.last_success_ms is None else _utc(self.last_success_ms)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _optional_ms(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def occurrence_of(message: Any) -> OccurrenceInfo | None:
    """Return the occurrence a Dramatiq message carries, or None if emq-bridge did not send it."""
    options = getattr(message, "options", None) or {}
    due_ms = options.get(OPTION_DUE_MS)
    if due_ms is None:
        return None
    return OccurrenceInfo(
        id=str(message.message_id),
        queue=str(options.get(OPTION_QUEUE) or message.queue_name),
        name=str(options.get(OPTION_NAME, "")),
        due_ms=int(due_ms),
        redelivered=bool(options.get(OPTION_REDELIVERED, False)),
        triggered=bool(options.get(OPTION_TRIGGERED, False)),
        options=options,
        backfill=bool(options.get(OPTION_BACKFILL, False)),
        released_ms=_optional_ms(options.get(OPTION_RELEASED_MS)),
        previous_due_ms=_optional_ms(options.get(OPTION_PREVIOUS_DUE_MS)),
        last_success_ms=_optional_ms(options.get(OPTION_LAST_SUCCESS_MS)),
        attempt=attempt_of(options),
    )


def attempt_of(options: Mapping[str, Any]) -> int:
    """Return the attempt a message's options say, from 1: Dramatiq's `retries` plus one."""
    retries = options.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        return 1
    return retries + 1


def current_occurrence() -> OccurrenceInfo | None:
    """Return the occurrence the running actor serves, or None outside a recurring message.

    Works inside an actor when the broker has a `RecurringMiddleware` (or Dramatiq's
    `CurrentMessage` middleware); call it from the actor's own thread.
    """
    message = _current.get()
    if message is None:
        message = CurrentMessage.get_current_message()
    return occurrence_of(message) if message is not None else None


def set_current_message(message: Any) -> None:
    """Record the message the current worker thread processes (the middleware's hook)."""
    _current.set(message)


def check_actors(broker: dramatiq.Broker, declarations: Iterable[Declaration], origin: str) -> None:
    """Raise `ConfigError` unless each declaration names an actor of `broker` on its queue,
    with message options Dramatiq's middleware can use (`message_option_error`)."""
    for declaration in declarations:
        where = f"{origin}: schedule {declaration.queue}/{declaration.name}"
        try:
            check_overlap(declaration.definition.overlap, f"{where}: ")
        except ScheduleError as exc:
            raise ConfigError(str(exc)) from None
        template = TaskTemplate.read(declaration.definition.template)
        task = template.task
        unusable = message_option_error(template.options)
        if unusable is not None:
            raise ConfigError(f"{where}: {unusable}")
        actor = broker.actors.get(task)
        if actor is None:
            known = ", ".join(sorted(broker.actors)) or "none"
            raise ConfigError(
                f"{where} names actor {task!r}, which is not declared on the broker "
                f"(declared actors: {known})"
            )
        if actor.queue_name != declaration.queue:
            raise ConfigError(
                f"{where} is in queue {declaration.queue!r}, but actor {task!r} consumes "
                f"queue {actor.queue_name!r}; declare it in that queue"
            )


def register(
    repeat: Repeat,
    actor: dramatiq.Actor[Any, Any] | str,
    *,
    every: float | timedelta | str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    name: str | None = None,
    anchor: Anchor = "grid",
    misfire: Misfire = "coalesce",
    overlap: DramatiqOverlap = "allow",
    pause_after_failures: int | None = None,
    catchup_window: float | timedelta | str | None = None,
    catchup_max: int | None = None,
    offset: Offset | None = None,
    at: Instant | Sequence[Instant] | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    limit: int | None = None,
    immediately: bool = False,
    labels: Mapping[str, str] | None = None,
    broker: dramatiq.Broker | None = None,
    now_ms: int | None = None,
) -> Registered:
    """Register a schedule for `actor` at runtime: `registered`, or `exists` if the name is taken.

    `actor` is an actor or its name on `broker` (default: the global broker); an unknown
    name raises `ConfigError` here, not at fire time. `overlap` and `pause_after_failures`
    are as for `recurring`. The registration has no source, so no boot-time sync ever
    removes it; `repeat.cancel` does. `now_ms` is for injected clocks.
    """
    if isinstance(actor, str):
        known = (broker or dramatiq.get_broker()).actors.get(actor)
        if known is None:
            raise ConfigError(f"actor {actor!r} is not declared on the broker")
        actor = known
    schedule = dramatiq_schedule(
        every=every,
        cron=cron,
        tz=tz,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        anchor=anchor,
        misfire=misfire,
        overlap=overlap,
        pause_after_failures=pause_after_failures,
        catchup_window=catchup_window,
        catchup_max=catchup_max,
        offset=offset,
        at=at,
        start_at=start_at,
        end_at=end_at,
        limit=limit,
        immediately=immediately,
        labels=labels,
    )
    declaration = schedule.bind(actor.actor_name, actor.queue_name)
    _check_arguments(actor, _signature(actor), schedule, declaration.name)
    check_actors(actor.broker, [declaration], "register")
    return repeat.register(
        declaration.queue, declaration.name, definition=declaration.definition, now_ms=now_ms
    )
