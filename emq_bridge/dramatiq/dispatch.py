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
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from typing import Any, NamedTuple

import dramatiq

from ..dispatch import batch_failure
from ..errors import (
    BrokerUnreachable,
    ConfigError,
    DispatchError,
    PermanentDispatchError,
    ScheduleError,
)
from ..occurrence import Occurrence
from ..template import TaskTemplate
from .batch_enqueue import (
    EnqueueScript,
    encoder,
    enqueue_hook,
    redis_message_ids,
    writes_as_dispatch_lua,
)
from .message_options import ENQUEUE_ARGUMENTS, message_option_error, per_message_keys
from .schedule import (
    OPTION_BACKFILL,
    OPTION_DUE_MS,
    OPTION_GUARDED,
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
    `PermanentDispatchError` (the pump parks the registration; for an undeclared actor its
    reason says that another app sharing the registry needs a prefix of its own). Its
    `message_timestamp` is when the pump claimed it, on the server's clock
    (`Occurrence.released_ms`), not this host's.
    """
    try:
        template = TaskTemplate.read(occurrence.template)
    except ScheduleError as exc:
        raise PermanentDispatchError(f"{_where(occurrence)}: {exc}") from exc
    actor = broker.actors.get(template.task)
    if actor is None:
        raise PermanentDispatchError(
            f"{_where(occurrence)}: {_undeclared(template.task)}{_SHARED_REGISTRY_HINT}"
        )
    stored = template.options
    if stored:  # most templates have none: nothing looked at per message
        if "delay" in stored or "eta" in stored:
            _say_not_delayed(occurrence, stored)
        written = per_message_keys(stored)
        if written:  # an earlier release's record: sent without them, as now declared
            _say_dropped(occurrence, written)
            stored = {key: value for key, value in stored.items() if key not in written}
    # One dict built once per message (the template's options first, ours over them).
    options = {
        **stored,
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
    if occurrence.guarded:
        options[OPTION_GUARDED] = True
    return dramatiq.Message(
        queue_name=actor.queue_name,
        actor_name=actor.actor_name,
        args=tuple(template.args),
        kwargs=dict(template.kwargs),
        options=options,
        message_id=occurrence.id,
        # Dramatiq stamps the sending host's clock, which a worker's `AgeLimit` (`max_age`)
        # compares with its own: the claim's server time instead, so a pump whose clock is
        # off sends no message that looks older (or younger) than it is.
        message_timestamp=occurrence.released_ms,
    )


# The registrations told of what their stored options hold (once each per process and
# warning; the oldest forgotten past the bound).
_TOLD: dict[tuple[str, str, str], None] = {}
_TOLD_MAX = 10_000


def _first_time(occurrence: Occurrence, warning: str) -> bool:
    """Say whether `occurrence`'s registration has not been told `warning` in this process
    yet, and remember that it now is."""
    key = (occurrence.queue, occurrence.name, warning)
    if key in _TOLD:
        return False
    if len(_TOLD) >= _TOLD_MAX:
        del _TOLD[next(iter(_TOLD))]
    _TOLD[key] = None
    return True


def _say_not_delayed(occurrence: Occurrence, options: Mapping[str, Any]) -> None:
    """Warn, once per registration, that its stored options hold `delay` or `eta`, which an
    earlier release (or `emq-bridge add` without `--dramatiq`) accepted: they are arguments
    of `broker.enqueue`, not message options, so the message goes out on time."""
    if not _first_time(occurrence, "delay"):
        return
    log.warning(
        "%s: its options hold %s, which does not delay a Dramatiq message (an argument of "
        "broker.enqueue, not a message option): it is sent on time; remove it and place the "
        "runs with the cadence (offset=, the cron expression, at=)",
        _where(occurrence),
        " and ".join(k for k in ENQUEUE_ARGUMENTS if k in options),
    )


def _say_dropped(occurrence: Occurrence, keys: Sequence[str]) -> None:
    """Warn, once per registration, that its stored options hold options Dramatiq or
    emq-bridge write on each message (`per_message_keys`), which an earlier release (or
    `emq-bridge add` without `--dramatiq`) accepted: Dramatiq would read them as its own
    (`retries: 3` starts the message on its fourth attempt), so they are left out."""
    if not _first_time(occurrence, "per-message"):
        return
    log.warning(
        "%s: its options hold %s, written on each message by Dramatiq or emq-bridge, not set "
        "by a schedule (retries would start the message on a later attempt): the message is "
        "sent without them; remove them from the schedule",
        _where(occurrence),
        ", ".join(repr(k) for k in keys),
    )


def _where(occurrence: Occurrence) -> str:
    return f"{occurrence.queue}/{occurrence.name}"  # built on failure only: not per message


def _undeclared(actor: str) -> str:
    return (
        f"actor {actor!r} is not declared on this broker; import the module that declares "
        "it (e.g. emq-bridge pump --dramatiq module:broker)"
    )


# Why a pump meets an actor its broker lacks, besides a missing import: a pump serves every
# registration of its queues, another app's too when both share one registry (one prefix).
_SHARED_REGISTRY_HINT = (
    "; or, if another app shares this registry (same prefix), give each app its own prefix "
    "(RecurringMiddleware(prefix=...), Celery's emq_bridge_prefix)"
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

    def check_queue(self, task: str, queue: str) -> None:
        """Raise `PermanentDispatchError` unless the actor `task` consumes `queue`: a schedule
        of another queue is pumped by no worker of that actor (the workers' boot refuses such
        a schedule in a file), and its messages would go to the actor's queue anyway."""
        actor = self.broker.actors.get(task)
        if actor is not None and actor.queue_name != queue:
            raise PermanentDispatchError(
                f"actor {task!r} consumes queue {actor.queue_name!r}, not {queue!r}; add the "
                "schedule in that queue"
            )

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise `PermanentDispatchError` if Dramatiq's middleware cannot use `options`
        (`message_option_error`). What `emq-bridge add --dramatiq SPEC --options ...` asks
        before it writes a schedule."""
        error = message_option_error(options)
        if error is not None:
            raise PermanentDispatchError(error)

    def dispatch(self, occurrence: Occurrence) -> None:
        """Enqueue `occurrence`; raise `DispatchError` if the broker fails, and
        `PermanentDispatchError` if its message can never be built."""
        message = build_message(self.broker, occurrence)
        try:
            self.broker.enqueue(message)
        except Exception as exc:
            unreachable = isinstance(exc, _BROKER_UNREACHABLE)
            raise (BrokerUnreachable if unreachable else DispatchError)(
                f"{occurrence.queue}/{occurrence.name}: the broker did not take occurrence "
                f"{occurrence.id}: {type(exc).__name__}: {exc}"
            ) from exc


# What a broker's enqueue raises when it cannot reach its server (Dramatiq's name for it since
# 2.x, `ConnectionError` before, which now warns when read), and the socket's own errors.
_BROKER_UNREACHABLE: tuple[type[BaseException], ...] = (
    getattr(dramatiq.errors, "BrokerConnectionError", None) or dramatiq.errors.ConnectionError,
    OSError,
)


class PipelinedDramatiqDispatcher(DramatiqDispatcher):
    """The fast path on a `RedisBroker`: a claimed batch is enqueued in one script call.

    `dramatiq_dispatcher` (the middleware's and `emq-bridge pump`'s default) chooses it
    for a broker `can_pipeline` accepts; constructed directly, it takes any `RedisBroker`.

    For each message it does what `RedisBroker.enqueue` does (Dramatiq 2.x): a fresh
    `redis_message_id` option, the `before_enqueue` middleware hook, the encoding by
    Dramatiq's encoder, the writes of the `enqueue` command of the broker's `dispatch`
    script, then `after_enqueue`. The writes of a batch are one call of
    `lua/dramatiq_enqueue.lua` (up to `ENQUEUE_CALL_SIZE` messages a call), which writes
    Dramatiq's keys itself (`batch_enqueue.py`). So it relies on internals of Dramatiq that
    are not public API: the keys and values `dispatch.lua` writes (`<namespace>:<queue>`,
    `<namespace>:<queue>.msgs`, `<namespace>:__heartbeats__`), the broker's `namespace`,
    `broker_id` and `client`, and `Message.encode` under the default `JSONEncoder`. It is
    tied to the Dramatiq versions its tests run (they compare its writes with `enqueue`'s,
    and a real worker consumes them); `can_pipeline` accepts Dramatiq 2.x only.
    """

    def __init__(self, broker: dramatiq.Broker) -> None:
        from dramatiq.brokers.redis import RedisBroker

        if not isinstance(broker, RedisBroker):
            raise ConfigError(
                f"PipelinedDramatiqDispatcher needs a RedisBroker, got {type(broker).__name__}; "
                "use DramatiqDispatcher"
            )
        super().__init__(broker)
        self.script = EnqueueScript(broker)

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        """Enqueue `occurrences` in one script call; return None or the error of each.

        A message that cannot be built, or that a `before_enqueue` hook refuses (a
        `MiddlewareError`), fails alone; a call the client could not make fails the
        messages it carried and those after it (`batch_failure`).
        """
        broker = self.broker
        errors: list[BaseException | None] = [None] * len(occurrences)
        # Looked up once a batch: the same for each of its messages.
        before = enqueue_hook(broker, "before")
        after = enqueue_hook(broker, "after")
        encode = encoder()
        # Per queue, in batch order, as each queue's list is consumed.
        by_queue: dict[str, list[_Prepared]] = {}
        redis_ids = redis_message_ids(len(occurrences))
        for index, occurrence in enumerate(occurrences):
            redis_id = redis_ids[index]
            try:
                message = build_message(broker, occurrence, redis_message_id=redis_id)
                if before is not None:
                    before(message, None)
                encoded = encode(message)  # after the hook, as in enqueue: it may add options
            except Exception as exc:  # a MiddlewareError refuses this message only
                errors[index] = exc
                continue
            by_queue.setdefault(message.queue_name, []).append(
                _Prepared(index, message, redis_id, encoded)
            )
        prepared = [item for items in by_queue.values() for item in items]
        for start in range(0, len(prepared), ENQUEUE_CALL_SIZE):
            failure = self._send(prepared[start : start + ENQUEUE_CALL_SIZE], after, errors)
            if failure is not None:  # the client failed: the rest waits for its leases
                for item in prepared[start + ENQUEUE_CALL_SIZE :]:
                    errors[item.position] = failure
                break
        return errors

    def _send(
        self,
        part: list[_Prepared],
        after: Callable[[dramatiq.Message[Any], None], None] | None,
        errors: list[BaseException | None],
    ) -> DispatchError | None:
        """Write `part` in one call, then run `after_enqueue` for each message written.

        Return the failure of a call the client could not make (each message of `part`
        then carries it), else None.
        """
        runs = _by_queue(part)
        groups = [(queue, [(item.redis_id, item.encoded) for item in run]) for queue, run in runs]
        try:
            refused = self.script.write(groups)
        except Exception as exc:  # the connection (or the script as a whole) failed: none
            failure = batch_failure(exc)  # of the call is known to be in
            for item in part:
                errors[item.position] = failure
            return failure
        for (_, run), error in zip(runs, refused, strict=True):
            for item in run:
                if error is not None:
                    errors[item.position] = DispatchError(
                        f"the broker did not take message {item.message.message_id} on queue "
                        f"{item.message.queue_name!r}: {error}"
                    )
                elif after is not None:
                    after(item.message, None)
        return None


class _Prepared(NamedTuple):
    """A message of a batch, ready to write: its place in the batch, the message, its
    Redis id and its bytes (a tuple: one is made per message)."""

    position: int
    message: dramatiq.Message[Any]
    redis_id: str
    encoded: bytes


def _by_queue(part: list[_Prepared]) -> list[tuple[str, list[_Prepared]]]:
    return [(queue, list(run)) for queue, run in groupby(part, key=_queue_of)]


def _queue_of(item: _Prepared) -> str:
    return item.message.queue_name


# The most messages one script call carries: a bigger batch is several calls, so that no
# one call holds the server for long (a few milliseconds per thousand small messages).
ENQUEUE_CALL_SIZE = 1000


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
    by a subclass or on the instance, nor replaced by a wrapper from another module, and
    whose `dispatch` script writes what `lua/dramatiq_enqueue.lua` writes in its stead
    (`writes_as_dispatch_lua`).
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
    return writes_as_dispatch_lua(broker)


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
