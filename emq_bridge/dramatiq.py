"""Dramatiq integration: recurring actors, boot-time sync, and the pump inside the worker.

Declare a schedule on an actor and add the middleware::

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from emq_bridge.dramatiq import RecurringMiddleware, recurring

    broker = RedisBroker(url="redis://localhost:6379/0")
    broker.add_middleware(RecurringMiddleware())
    dramatiq.set_broker(broker)

    @recurring(every="15m")
    @dramatiq.actor(queue_name="reports")
    def refresh_reports(): ...

Each occurrence is a real `dramatiq.Message` whose `message_id` is the occurrence id;
inside the actor, `current_occurrence()` returns its registration name and nominal time.
This module (with its private `_dramatiq_*` parts) is the only one that imports dramatiq.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import dramatiq
from dramatiq import broker as dramatiq_broker

from ._dramatiq_dispatch import DramatiqDispatcher, PipelinedDramatiqDispatcher, build_message
from ._dramatiq_middleware import (
    DEFAULT_SOURCE,
    BootError,
    RecurringMiddleware,
    RecurringOptionError,
    check_actors,
)
from ._dramatiq_schedule import (
    OPTION_DUE_MS,
    OPTION_NAME,
    OPTION_QUEUE,
    OPTION_REDELIVERED,
    OccurrenceInfo,
    Schedule,
    broker_declarations,
    cron,
    current_occurrence,
    every,
    occurrence_of,
    recurring,
)
from .cadence import Anchor, Misfire
from .dispatch import PumpTarget
from .errors import ConfigError
from .registry import Registered, Repeat

__all__ = [
    "DEFAULT_SOURCE",
    "OPTION_DUE_MS",
    "OPTION_NAME",
    "OPTION_QUEUE",
    "OPTION_REDELIVERED",
    "BootError",
    "DramatiqDispatcher",
    "OccurrenceInfo",
    "PipelinedDramatiqDispatcher",
    "RecurringMiddleware",
    "RecurringOptionError",
    "Schedule",
    "broker_declarations",
    "build_message",
    "cron",
    "current_occurrence",
    "every",
    "import_broker",
    "load_target",
    "occurrence_of",
    "recurring",
    "register",
]


def import_broker(spec: str) -> dramatiq.Broker:
    """Import `module` or `module:attr` the way the `dramatiq` command does; return its broker.

    `attr` may be a dotted path to a `Broker`, or a callable that sets the global broker.
    With `module` alone, the broker is the one the module set with `dramatiq.set_broker`.
    The current directory is put on `sys.path` first, as `dramatiq` does.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ConfigError(f"--dramatiq {spec!r}: give module or module:broker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import Dramatiq app {module_name!r}: {exc}") from exc
    if attr:
        found: Any = module
        for part in attr.split("."):
            if not hasattr(found, part):
                raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
            found = getattr(found, part)
        if isinstance(found, dramatiq.Broker):
            return found
        if not callable(found):
            raise ConfigError(f"{spec!r} is neither a Dramatiq broker nor a callable that sets one")
        found()
    if dramatiq_broker.global_broker is None:
        raise ConfigError(
            f"{spec!r} set no Dramatiq broker: name it (module:broker) or call dramatiq.set_broker"
        )
    return dramatiq.get_broker()


def _middleware(broker: dramatiq.Broker) -> RecurringMiddleware | None:
    return next((m for m in broker.middleware if isinstance(m, RecurringMiddleware)), None)


def load_target(spec: str, *, pipelined: bool = False) -> PumpTarget:
    """Import a Dramatiq app (`module:broker` or `module`) and return what a pump needs.

    `pipelined=True` sends through `PipelinedDramatiqDispatcher` (a `RedisBroker` only).

    The module is imported so its decorators run. The declarations are the schedules on
    the broker's actors; the source and queues follow the broker's `RecurringMiddleware`
    when it has one (so the standalone pump and the workers agree on ownership), else the
    source is `"dramatiq"` and the queues are every queue the broker declares.
    """
    broker = import_broker(spec)
    declarations = broker_declarations(broker)
    middleware = _middleware(broker)
    if middleware is not None:
        queues = middleware.queues(broker, declarations)
        source = middleware.source
    else:
        queues = tuple(sorted({d.queue for d in declarations} | set(broker.get_declared_queues())))
        source = DEFAULT_SOURCE
    if not queues:
        raise ConfigError(f"{spec!r} declares no actor, so there is no queue to pump")
    dispatcher = PipelinedDramatiqDispatcher(broker) if pipelined else DramatiqDispatcher(broker)
    return PumpTarget(dispatcher, queues, declarations, source)


def register(
    repeat: Repeat,
    actor: dramatiq.Actor[Any, Any] | str,
    *,
    every: int | timedelta | str | None = None,
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
