"""`DramatiqDispatcher`: each occurrence becomes a real `dramatiq.Message`.

Private to `emq_bridge.dramatiq`. The message goes through `broker.enqueue`, so the
broker's middleware runs, and carries the occurrence id as its `message_id` and the
registration name and nominal time in its options (see `OccurrenceInfo`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import dramatiq

from ._dramatiq_schedule import (
    OPTION_DUE_MS,
    OPTION_NAME,
    OPTION_QUEUE,
    OPTION_REDELIVERED,
    OPTION_TRIGGERED,
)
from .errors import DispatchError
from .registry import Occurrence

__all__ = ["DramatiqDispatcher", "build_message"]

log = logging.getLogger(__name__)


def _template_part(occurrence: Occurrence, key: str, kind: type, default: Any) -> Any:
    value = occurrence.template.get(key, default)
    if not isinstance(value, kind):
        raise DispatchError(
            f"{occurrence.queue}/{occurrence.name}: template {key!r} must be a "
            f"{kind.__name__}, got {type(value).__name__}"
        )
    return value


def build_message(broker: dramatiq.Broker, occurrence: Occurrence) -> dramatiq.Message[Any]:
    """Return the message of `occurrence` for `broker`; raise `DispatchError` if it cannot be built.

    The actor named by the template's `task` must be declared on `broker`: its queue is
    the message's queue.
    """
    task = occurrence.template.get("task")
    if not isinstance(task, str) or not task:
        raise DispatchError(
            f"{occurrence.queue}/{occurrence.name}: template has no 'task' naming a Dramatiq actor"
        )
    actor = broker.actors.get(task)
    if actor is None:
        raise DispatchError(
            f"{occurrence.queue}/{occurrence.name}: actor {task!r} is not declared on this broker; "
            "import the module that declares it (e.g. emq-bridge pump --dramatiq module:broker)"
        )
    args = _template_part(occurrence, "args", list, [])
    kwargs = _template_part(occurrence, "kwargs", Mapping, {})
    options = dict(_template_part(occurrence, "options", Mapping, {}))
    options.update({
        OPTION_DUE_MS: occurrence.due_ms,
        OPTION_NAME: occurrence.name,
        OPTION_QUEUE: occurrence.queue,
        OPTION_REDELIVERED: occurrence.redelivered,
        OPTION_TRIGGERED: occurrence.triggered,
    })
    return dramatiq.Message(
        queue_name=actor.queue_name,
        actor_name=actor.actor_name,
        args=tuple(args),
        kwargs=dict(kwargs),
        options=options,
        message_id=occurrence.id,
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
                "it; pass confirm_delivery=True for at-least-once delivery", type(broker).__name__,
            )

    def dispatch(self, occurrence: Occurrence) -> None:
        """Enqueue `occurrence`; raise `DispatchError` if it cannot be built or the broker fails."""
        message = build_message(self.broker, occurrence)
        try:
            self.broker.enqueue(message)
        except Exception as exc:
            raise DispatchError(
                f"{occurrence.queue}/{occurrence.name}: the broker did not take occurrence "
                f"{occurrence.id}: {type(exc).__name__}: {exc}"
            ) from exc
