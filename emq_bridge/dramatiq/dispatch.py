"""`DramatiqDispatcher`: each occurrence becomes a real `dramatiq.Message`.

Part of `emq_bridge.dramatiq`. The message goes through `broker.enqueue` (or, on a
`RedisBroker`, through `PipelinedDramatiqDispatcher`, which does what `enqueue` does for a
whole batch in one round trip), so the broker's middleware runs, and carries the occurrence
id as its `message_id` and the registration name, nominal time and previous-run context in
its options (see `OccurrenceInfo`), which the worker's `RecurringMiddleware` reports from.
`dramatiq_dispatcher` picks between the two.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

import dramatiq
from dramatiq.common import current_millis

from ..dispatch import batch_failure
from ..errors import ConfigError, DispatchError, PermanentDispatchError, ScheduleError
from ..occurrence import Occurrence
from ..template import TaskTemplate
from .schedule import (
    OPTION_BACKFILL,
    OPTION_DUE_MS,
    OPTION_LAST_SUCCESS_MS,
    OPTION_NAME,
    OPTION_PREVIOUS_DUE_MS,
    OPTION_QUEUE,
    OPTION_REDELIVERED,
    OPTION_RELEASED_MS,
    OPTION_TRIGGERED,
)

__all__ = [
    "DramatiqDispatcher",
    "PipelinedDramatiqDispatcher",
    "build_message",
    "can_pipeline",
    "dramatiq_dispatcher",
]

log = logging.getLogger(__name__)


def build_message(
    broker: dramatiq.Broker, occurrence: Occurrence, **extra_options: Any
) -> dramatiq.Message[Any]:
    """Return the message of `occurrence` for `broker`.

    The actor named by the template's `task` must be declared on `broker`: its queue is
    the message's queue. An unreadable template or an undeclared actor can never be sent:
    `PermanentDispatchError` (the pump parks the registration).
    """
    where = f"{occurrence.queue}/{occurrence.name}"
    try:
        template = TaskTemplate.read(occurrence.template)
    except ScheduleError as exc:
        raise PermanentDispatchError(f"{where}: {exc}") from exc
    actor = broker.actors.get(template.task)
    if actor is None:
        raise PermanentDispatchError(f"{where}: {_undeclared(template.task)}")
    # One dict built once per message (the template's options first, ours over them).
    options = {
        **template.options,
        OPTION_DUE_MS: occurrence.due_ms,
        OPTION_NAME: occurrence.name,
        OPTION_QUEUE: occurrence.queue,
        OPTION_REDELIVERED: occurrence.redelivered,
        OPTION_TRIGGERED: occurrence.triggered,
        OPTION_BACKFILL: occurrence.backfill,
        OPTION_RELEASED_MS: occurrence.released_ms,
        OPTION_PREVIOUS_DUE_MS: occurrence.previous_due_ms,
        OPTION_LAST_SUCCESS_MS: occurrence.last_success_ms,
        **extra_options,
    }
    return dramatiq.Message(
        queue_name=actor.queue_name,
        actor_name=actor.actor_name,
        args=tuple(template.args),
        kwargs=dict(template.kwargs),
        options=options,
        message_id=occurrence.id,
    )


def _undeclared(actor: str) -> str:
    return (
        f"actor {actor!r} is not declared on this broker; import the module that declares "
        "it (e.g. emq-bridge pump --dramatiq module:broker)"
    )


class DramatiqDispatcher:
    """Enqueue each occurrence on `broker` as a Dramatiq message whose id is the occurrence id.

    `dispatch` returns once `broker.enqueue` returns. On RabbitMQ that means the broker
    accepted the message only with `RabbitmqBroker(confirm_delivery=True)`; without it a
    crash right after the publish can lose the occurrence, so a warning says so.
    """

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.broker = broker
        if getattr(broker, "confirm_delivery", True) is False:
            log.warning(
                "%s has confirm_delivery=False: an occurrence is acked before RabbitMQ confirms "
                "it; pass confirm_delivery=True for at-least-once delivery",
                type(broker).__name__,
            )

    def check_task(self, task: str) -> None:
        """Raise `PermanentDispatchError` unless `task` is an actor declared on the broker.

        What `emq-bridge add --dramatiq SPEC` asks before it writes a schedule.
        """
        if task not in self.broker.actors:
            raise PermanentDispatchError(_undeclared(task))

    def dispatch(self, occurrence: Occurrence) -> None:
        """Enqueue `occurrence`; raise `DispatchError` if the broker fails, and
        `PermanentDispatchError` if its message can never be built."""
        message = build_message(self.broker, occurrence)
        try:
            self.broker.enqueue(message)
        except Exception as exc:
            raise DispatchError(
                f"{occurrence.queue}/{occurrence.name}: the broker did not take occurrence "
                f"{occurrence.id}: {type(exc).__name__}: {exc}"
            ) from exc


class PipelinedDramatiqDispatcher(DramatiqDispatcher):
    """The fast path on a `RedisBroker`: a claimed batch is enqueued in one round trip.

    `dramatiq_dispatcher` (the middleware's and `emq-bridge pump`'s default) chooses it
    for a broker `can_pipeline` accepts; constructed directly, it takes any `RedisBroker`.

    For each message it does what `RedisBroker.enqueue` does (Dramatiq 2.x): a fresh
    `redis_message_id`, the `before_enqueue` middleware hook, the broker's own `dispatch`
    script with the same arguments, then `after_enqueue`; only the script calls of a batch
    share one pipeline. It reads broker attributes that are not public API
    (`scripts`, `_should_do_maintenance`, `_max_unpack_size`), so it is tied to the Dramatiq
    versions its tests run (a real worker consumes what it writes).
    """

    def __init__(self, broker: dramatiq.Broker) -> None:
        from dramatiq.brokers.redis import RedisBroker

        if not isinstance(broker, RedisBroker):
            raise ConfigError(
                f"PipelinedDramatiqDispatcher needs a RedisBroker, got {type(broker).__name__}; "
                "use DramatiqDispatcher"
            )
        super().__init__(broker)

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        """Enqueue `occurrences` in one pipeline; return None or the error of each."""
        broker: Any = self.broker
        errors: list[BaseException | None] = [None] * len(occurrences)
        prepared: list[tuple[int, dramatiq.Message[Any]]] = []
        for index, occurrence in enumerate(occurrences):
            try:
                message = build_message(broker, occurrence, redis_message_id=str(uuid4()))
                broker.emit_before("enqueue", message, None)
            except Exception as exc:  # a MiddlewareError refuses this message only
                errors[index] = exc
                continue
            prepared.append((index, message))
        if not prepared:
            return errors
        dispatch = broker.scripts["dispatch"]
        pipe = broker.client.pipeline(transaction=False)
        for _, message in prepared:
            dispatch(
                keys=[broker.namespace],
                args=[
                    "enqueue",
                    current_millis(),
                    message.queue_name,
                    broker.broker_id,
                    broker.heartbeat_timeout,
                    broker.dead_message_ttl,
                    broker._should_do_maintenance("enqueue"),
                    broker._max_unpack_size(),
                    message.options["redis_message_id"],
                    message.encode(),
                ],
                client=pipe,
            )
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection failed: none of the batch is known to be in
            failure = batch_failure(exc)
            for index, _ in prepared:
                errors[index] = failure
            return errors
        for (index, message), reply in zip(prepared, replies, strict=True):
            if isinstance(reply, Exception):
                errors[index] = reply
            else:
                broker.emit_after("enqueue", message, None)
        return errors


# The Dramatiq major version whose `RedisBroker.enqueue` the pipelined path reproduces, and
# its tests run on: the automatic choice takes the fast path on that version only.
PIPELINED_DRAMATIQ_MAJOR = 2
# What the pipelined path stands in for: a broker overriding any of them (a subclass, or a
# patch on the instance) sends as it decides, so it keeps `broker.enqueue`.
_ENQUEUE_METHODS = (
    "enqueue",
    "_dispatch",
    "__getattr__",
    "_should_do_maintenance",
    "_max_unpack_size",
)


def can_pipeline(broker: dramatiq.Broker) -> bool:
    """Say whether `PipelinedDramatiqDispatcher` sends on `broker` what `broker.enqueue` would.

    True for a `RedisBroker` of Dramatiq 2.x whose enqueue is Dramatiq's own: not overridden
    by a subclass or on the instance, nor replaced by a wrapper from another module.
    """
    from dramatiq.brokers.redis import RedisBroker

    if not isinstance(broker, RedisBroker) or _major(dramatiq.__version__) != (
        PIPELINED_DRAMATIQ_MAJOR
    ):
        return False
    kind = type(broker)
    for name in _ENQUEUE_METHODS:
        method = getattr(kind, name, None)
        if method is not getattr(RedisBroker, name, None) or name in vars(broker):
            return False
        if getattr(method, "__module__", None) != RedisBroker.__module__:
            return False
    if any("do_enqueue" in vars(k) for k in kind.__mro__) or "do_enqueue" in vars(broker):
        return False
    scripts = getattr(broker, "scripts", None)
    return isinstance(scripts, dict) and "dispatch" in scripts


def _major(version: str) -> int | None:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def dramatiq_dispatcher(
    broker: dramatiq.Broker, pipelined: bool | None = None
) -> DramatiqDispatcher:
    """Return the dispatcher for `broker`: `pipelined=None` chooses, `True` or `False` say.

    None (automatic) is `PipelinedDramatiqDispatcher` where `can_pipeline(broker)`, else
    `DramatiqDispatcher`; both send the same messages through the same middleware hooks.
    True on a broker that is not a `RedisBroker` raises `ConfigError`.
    """
    if pipelined is None:
        pipelined = can_pipeline(broker)
    elif not isinstance(pipelined, bool):
        raise ConfigError(f"pipelined must be True, False or None (automatic), got {pipelined!r}")
    return PipelinedDramatiqDispatcher(broker) if pipelined else DramatiqDispatcher(broker)
