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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import dramatiq
from dramatiq.middleware import CurrentMessage

from ..cadence import Anchor, Misfire
from ..definition import Declaration, Schedule
from ..errors import ConfigError, ScheduleError
from ..registry import Registered, Repeat
from ..template import TaskTemplate

__all__ = [
    "OPTION_DUE_MS",
    "OPTION_NAME",
    "OPTION_QUEUE",
    "OPTION_REDELIVERED",
    "OPTION_TRIGGERED",
    "RECURRING_OPTION",
    "OccurrenceInfo",
    "Schedule",
    "actor_declarations",
    "broker_declarations",
    "check_actors",
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

_DECORATED = "_emq_recurring"  # attribute on an Actor: the schedules its decorators declared
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("emq_bridge_message", default=None)

ActorT = TypeVar("ActorT")


def every(
    interval: float | timedelta | str,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    name: str | None = None,
    anchor: Anchor = "schedule",
    misfire: Misfire = "coalesce",
) -> Schedule:
    """Return an interval schedule, e.g. `every("15m")`, for `@dramatiq.actor(recurring=...)`."""
    return Schedule(
        every=interval,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        anchor=anchor,
        misfire=misfire,
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
) -> Schedule:
    """Return a cron schedule in `tz` (IANA, default UTC), e.g. `cron("0 9 * * 1-5")`."""
    return Schedule(
        cron=expression,
        tz=tz,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        misfire=misfire,
    )


def recurring(
    *,
    every: float | timedelta | str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    name: str | None = None,
    anchor: Anchor = "schedule",
    misfire: Misfire = "coalesce",
) -> Callable[[ActorT], ActorT]:
    """Declare a recurring schedule on the actor below: stack it above `@dramatiq.actor`.

    Raises `ScheduleError` at import time for an invalid cadence, non-JSON arguments, a
    decorator placed below `@dramatiq.actor`, or a name another schedule of the actor holds.
    """
    schedule = Schedule(
        every=every,
        cron=cron,
        tz=tz,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        anchor=anchor,
        misfire=misfire,
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
                schedules.append(Schedule(**item))
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
    for schedule in schedules:
        declaration = schedule.bind(actor.actor_name, actor.queue_name)
        if declaration.name in found:
            raise ScheduleError(
                f"actor {actor.actor_name!r} declares two schedules named {declaration.name!r}; "
                "give each schedule of one actor a distinct name="
            )
        found[declaration.name] = declaration
    return list(found.values())


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
    """What an actor knows of the occurrence it serves: its id, registration and nominal time.

    `redelivered` is true when the occurrence was sent again after its lease expired (the
    pump that claimed it may have enqueued it already); `triggered` is true for a manual
    `trigger` (a fresh occurrence at the moment of the trigger).
    """

    id: str
    queue: str
    name: str
    due_ms: int
    redelivered: bool = False
    triggered: bool = False
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def due(self) -> datetime:
        """The nominal instant of this occurrence, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.due_ms / 1000, tz=timezone.utc)


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
    )


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
    """Raise `ConfigError` unless each declaration names an actor of `broker` on its queue."""
    for declaration in declarations:
        where = f"{origin}: schedule {declaration.queue}/{declaration.name}"
        task = TaskTemplate.read(declaration.definition.template).task
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
    anchor: Anchor = "schedule",
    misfire: Misfire = "coalesce",
    broker: dramatiq.Broker | None = None,
    now_ms: int | None = None,
) -> Registered:
    """Register a schedule for `actor` at runtime: `registered`, or `exists` if the name is taken.

    `actor` is an actor or its name on `broker` (default: the global broker); an unknown
    name raises `ConfigError` here, not at fire time. The registration has no source, so
    no boot-time sync ever removes it; `repeat.cancel` does. `now_ms` is for injected clocks.
    """
    if isinstance(actor, str):
        known = (broker or dramatiq.get_broker()).actors.get(actor)
        if known is None:
            raise ConfigError(f"actor {actor!r} is not declared on the broker")
        actor = known
    schedule = Schedule(
        every=every,
        cron=cron,
        tz=tz,
        args=args,
        kwargs=kwargs,
        options=options,
        name=name,
        anchor=anchor,
        misfire=misfire,
    )
    declaration = schedule.bind(actor.actor_name, actor.queue_name)
    check_actors(actor.broker, [declaration], "register")
    return repeat.register(
        declaration.queue, declaration.name, definition=declaration.definition, now_ms=now_ms
    )
