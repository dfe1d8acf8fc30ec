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
inside the actor, `current_occurrence()` returns its registration name, nominal time and
previous-run context. The middleware reports what becomes of each occurrence (started,
succeeded, retrying, failed, skipped) to the registry: `repeat.history(queue, name)`.
This package is the only part of emq-bridge that imports dramatiq.
"""

from __future__ import annotations

try:
    import dramatiq as _dramatiq  # noqa: F401  # only to say which extra is missing
except ImportError as exc:  # pragma: no cover - exercised without dramatiq installed
    raise ImportError(
        "emq_bridge.dramatiq needs Dramatiq: pip install 'emq-bridge[dramatiq]'"
    ) from exc

from ..definition import Schedule
from .dispatch import (
    DramatiqDispatcher,
    PipelinedDramatiqDispatcher,
    build_message,
    can_pipeline,
    dramatiq_dispatcher,
)
from .middleware import DEFAULT_SOURCE, BootError, RecurringMiddleware, RecurringOptionError
from .schedule import (
    OPTION_DUE_MS,
    OPTION_GUARDED,
    OPTION_LAST_SUCCESS_MS,
    OPTION_NAME,
    OPTION_PREVIOUS_DUE_MS,
    OPTION_QUEUE,
    OPTION_REDELIVERED,
    OPTION_RELEASED_MS,
    OPTION_TRIGGERED,
    OccurrenceInfo,
    broker_declarations,
    check_actors,
    cron,
    current_occurrence,
    every,
    occurrence_of,
    recurring,
    register,
)
from .target import import_broker, load_target

__all__ = [
    "DEFAULT_SOURCE",
    "OPTION_DUE_MS",
    "OPTION_GUARDED",
    "OPTION_LAST_SUCCESS_MS",
    "OPTION_NAME",
    "OPTION_PREVIOUS_DUE_MS",
    "OPTION_QUEUE",
    "OPTION_REDELIVERED",
    "OPTION_RELEASED_MS",
    "OPTION_TRIGGERED",
    "BootError",
    "DramatiqDispatcher",
    "OccurrenceInfo",
    "PipelinedDramatiqDispatcher",
    "RecurringMiddleware",
    "RecurringOptionError",
    "Schedule",
    "broker_declarations",
    "build_message",
    "can_pipeline",
    "check_actors",
    "cron",
    "current_occurrence",
    "dramatiq_dispatcher",
    "every",
    "import_broker",
    "load_target",
    "occurrence_of",
    "recurring",
    "register",
]
