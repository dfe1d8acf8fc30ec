"""`CeleryDispatcher`: each occurrence becomes a real Celery task, and what a task reads of it.

The task is sent through `apply_async` (or `send_task` for a name the app does not know:
another service may define it), so Celery's routing, signals and serialisation all apply.
Its `task_id` is the occurrence id; the headers (`occurrence_headers`) carry
`celery_beat_task` (as Celery's beat sets), `emq_due_ms` (the nominal time), `emq_schedule`
(`"<queue>/<name>"`), and what the worker reports with and a task may read: `emq_released_ms`
(when a pump claimed it, server clock), `emq_redelivered`, `emq_triggered`,
`emq_previous_due_ms` (the slot fired before) and `emq_last_success_ms` (when a run last
succeeded), the last two null when unknown. Times are epoch ms.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from celery import Celery, Task
from celery.app.routes import MapRoute
from celery.exceptions import QueueNotFound
from kombu.exceptions import OperationalError

from ..dispatch import batch_failure
from ..errors import BrokerUnreachable, DispatchError, PermanentDispatchError, ScheduleError
from ..occurrence import Occurrence
from ..outcome import error_text
from ..template import TaskTemplate, thaw
from .expiry import delay_in_ms, expires_in_ms, server_expiry, task_expires
from .kombu_entities import ENTITY_OPTIONS, KOMBU_TAG, entity_from_json, routing_entities
from .routing import resolve_queue

__all__ = [
    "BACKFILL_HEADER",
    "BEAT_HEADER",
    "DUE_HEADER",
    "GUARDED_HEADER",
    "LAST_SUCCESS_HEADER",
    "PREVIOUS_DUE_HEADER",
    "REDELIVERED_HEADER",
    "RELEASED_HEADER",
    "REPLACES_HEADER",
    "ROUTING_OPTIONS",
    "SCHEDULE_HEADER",
    "TRIGGERED_HEADER",
    "CeleryDispatcher",
    "arguments_refused",
    "fail_over",
    "header",
    "last_success_time",
    "nominal_due_ms",
    "nominal_time",
    "occurrence_headers",
    "previous_nominal_time",
    "routing_option_error",
]

log = logging.getLogger(__name__)

DUE_HEADER = "emq_due_ms"
SCHEDULE_HEADER = "emq_schedule"
BEAT_HEADER = "celery_beat_task"
RELEASED_HEADER = "emq_released_ms"
REDELIVERED_HEADER = "emq_redelivered"
TRIGGERED_HEADER = "emq_triggered"
BACKFILL_HEADER = "emq_backfill"  # sent by a backfill (backfill.py), for a past slot
PREVIOUS_DUE_HEADER = "emq_previous_due_ms"
LAST_SUCCESS_HEADER = "emq_last_success_ms"
# True for an occurrence of a registration with an overlap policy (skip, buffer_one, replace).
GUARDED_HEADER = "emq_guarded"
# On the message `Task.replace()` sends in place of an occurrence's task (the same task id):
# the attempt it replaces, whose occurrence the replacement then runs and reports
# (`reporting`). Not one of `occurrence_headers`: a pump never sends it.
REPLACES_HEADER = "emq_replaces"
# A publish to RabbitMQ waits at most this long for the socket, and as long again for the
# broker's confirm (`confirm_publish`): a broker that hangs (frozen, or a network that drops
# everything) fails the send, which is retried when its lease expires, instead of holding the
# beat in one send for as long as it hangs. kombu's publish retry policy may try a few times.
# Under the lease (60 s), so a send that fails is not one that went out after its lease.
AMQP_SEND_TIMEOUT_S = 5.0


def occurrence_headers(occurrence: Occurrence) -> dict[str, Any]:
    """Return the headers emq-bridge sets on the task of `occurrence` (see the module
    docstring); every key is always present, so each message of a registration has the
    same shape."""
    return {
        BEAT_HEADER: True,
        DUE_HEADER: occurrence.due_ms,
        SCHEDULE_HEADER: f"{occurrence.queue}/{occurrence.name}",
        RELEASED_HEADER: occurrence.released_ms,
        REDELIVERED_HEADER: occurrence.redelivered,
        TRIGGERED_HEADER: occurrence.triggered,
        BACKFILL_HEADER: occurrence.backfill,
        PREVIOUS_DUE_HEADER: occurrence.previous_due_ms,
        LAST_SUCCESS_HEADER: occurrence.last_success_ms,
        GUARDED_HEADER: occurrence.guarded,
    }


class CeleryDispatcher:
    """Send each occurrence as a real Celery task (`task_id` = the occurrence id).

    The template's `options` (queue, priority, expires, headers, exchange, routing_key, ...)
    are passed to `apply_async`, a kombu `Queue` or `Exchange` described in them rebuilt
    (`routing_entities`), as Celery's beat passes the objects. Without a queue, exchange or
    routing key the task goes to the registry's queue: when Celery's own routing of the task
    names that queue (as it does for a `beat_schedule` entry) the task is sent as Celery's
    beat sends it and Celery routes it (`task_routes`, a route's kombu `Queue` with its
    exchange, routing key and arguments, `task_default_*`); otherwise (a schedule added to
    another queue) to the queue by name. `expires` (the options', else the task's own) counts
    from the claim on the server's clock (`expiry.server_expiry`), not from this host's: the
    message's `expires` is the instant, its AMQP `expiration` the seconds from the claim.
    `dispatch` returns once `apply_async` returns, `dispatch_batch` once the batch is
    published; with RabbitMQ set `broker_transport_options={"confirm_publish": True}` to
    make that mean "accepted".

    A template with no usable task is a `PermanentDispatchError` (the pump parks its
    registration). A task name the app does not know is sent by name, as Celery's beat does,
    since a worker of another service may define it, with one WARNING per queue and task
    (`note_unknown_task`); with `known_tasks_only=True` it is a `PermanentDispatchError`
    too. A broker that refuses is a `DispatchError`, retried. Under `task_always_eager` (a
    test) `apply_async` runs the task in this process instead: each occurrence runs once,
    and what the task raises (`task_eager_propagates`) is logged at ERROR, the occurrence
    counted as sent (as Celery's beat does), never sent again.
    """

    def __init__(
        self,
        app: Celery,
        *,
        known_tasks_only: bool = False,
        extra_headers: Callable[[Occurrence], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.app = app
        self.known_tasks_only = known_tasks_only
        # Called before each send; what it returns joins the task's headers (the beat's
        # Sentry Crons check-in, `sentry.BeatMonitors.headers`).
        self.extra_headers = extra_headers
        # (task, queue) -> whether the task's routing names the queue (`_routed_to`), kept
        # while every `task_routes` route is a plain map (those see no arguments).
        self._routed: dict[tuple[str, str], bool] = {}
        self._batch_at_once: bool | None = None
        # (queue, task) pairs whose task this app lacks, warned of once (`note_unknown_task`).
        self._unknown_told: set[tuple[str, str]] = set()
        self._amqp, self._unreachable = _transport_of(app)
        # Told at the first send, once: RabbitMQ without publisher confirms.
        self._unconfirmed = self._amqp and not (app.conf.broker_transport_options or {}).get(
            "confirm_publish"
        )

    def expiry_ms(self, template: Mapping[str, Any]) -> int | None:
        """How long after its send a task of `template` may still be started: its `expires`
        (`expiry.expires_in_ms`), or None. The pump bounds a guarded occurrence's wait for
        its start by it, from the claim, as the message's `expires` counts relative seconds
        (`send`): RabbitMQ drops an expired task unseen, and nothing reports it."""
        task = self.app.tasks.get(template.get("task"))
        return expires_in_ms(template, task_default=getattr(task, "expires", None))

    def delay_ms(self, template: Mapping[str, Any]) -> int | None:
        """How long after its send a task of `template` waits before a worker may start it:
        its `countdown` or `eta` (`expiry.delay_in_ms`), or None. The pump lengthens a guarded
        occurrence's start timeout by it, so a task waiting out its countdown is in flight,
        not lost (and its next slot skipped, not sent beside it)."""
        return delay_in_ms(template)

    def headers(self, occurrence: Occurrence) -> dict[str, Any]:
        """Return the headers of `occurrence`'s task: `occurrence_headers` and `extra_headers`'."""
        headers = occurrence_headers(occurrence)
        if self.extra_headers is not None:
            headers.update(self.extra_headers(occurrence) or {})
        return headers

    def check_task(self, task: str) -> None:
        """Raise `PermanentDispatchError` unless the app defines `task` (`app.tasks`).

        What `emq-bridge add --celery SPEC` asks before it writes a schedule.
        """
        if task not in self.app.tasks:
            raise PermanentDispatchError(
                f"task {task!r} is not a task of the Celery app {self.app.main or 'app'!r}: "
                "import the module that defines it"
            )

    def note_unknown_task(self, queue: str, name: str, task: str) -> None:
        """Warn, once per `queue` and `task`, that registration `queue/name`'s task is not
        one of this app's, so it goes by name to this app's broker.

        Another service's worker may define it; but a pump serves every registration of its
        queues, whichever app declared it, so an app sharing this registry (same prefix) is
        the likelier cause, and only a prefix of its own keeps its schedules apart.
        """
        key = (queue, task)
        if key in self._unknown_told:
            return
        if len(self._unknown_told) >= ROUTED_CACHE_SIZE:
            self._unknown_told.clear()
        self._unknown_told.add(key)
        log.warning(
            "%s/%s: task %r is not registered in the Celery app %r; sent by name to this "
            "app's broker. If another app shares this registry (same emq_bridge_prefix), "
            "give each app its own emq_bridge_prefix",
            queue,
            name,
            task,
            self.app.main or "app",
        )

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise `PermanentDispatchError` if a template's `options` can never route a task.

        What `emq-bridge add --celery SPEC --options ...` asks before it writes a schedule.
        """
        unroutable = routing_option_error(options)
        if unroutable is not None:
            raise PermanentDispatchError(unroutable)

    def dispatch(self, occurrence: Occurrence) -> None:
        self.send(occurrence, occurrence.id, self.headers(occurrence))

    def revoke(self, occurrence_id: str) -> None:
        """Revoke the task of `occurrence_id`, terminating it if it runs.

        `app.control.revoke(occurrence_id, terminate=True)`: every worker drops the message
        if it has not started and sends SIGTERM to the pool process running it (a pool that
        can terminate, such as prefork; on solo or threads a running task runs on). The pump
        calls it for `overlap="replace"`. Raises `DispatchError` if the broadcast fails.
        """
        try:
            self.app.control.revoke(occurrence_id, terminate=True)
        except Exception as exc:
            raise DispatchError(f"revoking task {occurrence_id} failed: {exc}") from exc

    @property
    def batch_at_once(self) -> bool:
        """Whether `dispatch_batch` reaches the broker as one publish: kombu can batch this
        broker's publishes (`Producer.batch()`, the Redis transport). Elsewhere (RabbitMQ)
        the pump sends a batch one task at a time through `dispatch`, keeping its leases
        between the sends, so a publish the broker holds up (a memory alarm) re-sends at most
        itself. Read from the transport, without connecting; once known, kept."""
        known = self._batch_at_once
        if known is None:
            try:
                connection = self.app.connection_for_write()
                try:
                    transport = connection.transport
                    supported = bool(getattr(transport.implements, "batch_publish", False))
                    known = supported and bool(
                        getattr(transport, "supports_batch_publish", supported)
                    )
                finally:
                    connection.release()
            except Exception:  # unknown: the batch path, as before; asked again next batch
                return True
            self._batch_at_once = known
        return known

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        """Send a claimed batch, each through `apply_async`, on one producer.

        Where kombu can batch publishes (kombu 5.7+, the Redis transport), the batch's
        messages reach the broker in one pipeline when the batch ends (`_RedisPublishBatch`:
        the commands kombu's Redis channel makes, byte for byte); every signal and hook
        still runs per message. Each reply of that pipeline is read: a message Redis
        refused (out of memory, a key of another type) is reported failed with that
        refusal, and the rest of the batch, which Redis took, is not. If the pipeline fails
        as a whole (the connection drops), delivery of the whole batch is uncertain, so every
        message is reported failed and comes back with the same id when its lease expires.
        Elsewhere (RabbitMQ) each message is published as sent.
        """
        errors: list[BaseException | None] = [None] * len(occurrences)
        try:
            with self.app.producer_or_acquire() as producer:
                batch = None
                if getattr(producer, "supports_batch_publish", False):
                    batch = _RedisPublishBatch.install(producer)
                if batch is None:
                    self._send_each(occurrences, errors, producer)
                    return errors
                try:
                    self._send_each(occurrences, errors, producer, batch)
                finally:
                    batch.uninstall()
                batch.send(occurrences, errors)
        except Exception as exc:  # no producer: nothing of the batch was sent
            failure = batch_failure(exc)
            return [error or failure for error in errors]
        return errors

    def _send_each(
        self,
        occurrences: Sequence[Occurrence],
        errors: list[BaseException | None],
        producer: Any,
        batch: _RedisPublishBatch | None = None,
    ) -> None:
        for index, occurrence in enumerate(occurrences):
            if batch is not None:
                batch.index = index
            try:
                headers = self.headers(occurrence)
                self.send(occurrence, occurrence.id, headers, producer=producer)
            except Exception as exc:
                errors[index] = exc

    def send(
        self,
        occurrence: Occurrence,
        task_id: str,
        emq_headers: Mapping[str, Any],
        producer: Any = None,
    ) -> None:
        """Send `occurrence` as task `task_id` with `emq_headers` (`occurrence_headers`) over
        the template's own headers, through `apply_async`.

        `PipelinedCeleryDispatcher` calls it with marker values and a capturing producer.
        """
        # A permanent error names no registration: the pipelined path sends a marked copy.
        try:
            template = TaskTemplate.read(occurrence.template)
        except ScheduleError as exc:
            raise PermanentDispatchError(f"its template cannot be sent: {exc}") from exc
        name = template.task
        # Plain containers all the way down: the template is shared and read-only, and a
        # task's own `apply_async` (a base class adding to a nested kwarg) or a
        # `before_task_publish` receiver may change what it is given, as under Celery's beat.
        options = thaw(template.options)
        try:
            self.check_options(options)
        except PermanentDispatchError as exc:
            raise PermanentDispatchError(f"its template cannot be sent: {exc}") from exc
        queue, exchange = options.get("queue"), options.get("exchange")
        if isinstance(queue, Mapping) or isinstance(exchange, Mapping):
            options = routing_entities(options)  # checked above: a Queue or Exchange described
        headers = dict(options.pop("headers", None) or {})
        headers.update(emq_headers)
        task = self.app.tasks.get(name)
        expiry = server_expiry(
            task_expires(options, getattr(task, "expires", None)),
            occurrence.released_ms,
        )
        if expiry is not None:
            # Celery would date it by this host's clock, which a worker checks against its
            # own, and RabbitMQ's TTL too; the claim's server time instead: the header
            # replaced, and the seconds given so that Celery makes the AMQP `expiration`
            # (a TTL the broker counts) of them.
            headers["expires"] = expiry.header
            options["expires"] = expiry.seconds
        if not {"queue", "exchange", "routing_key"} & options.keys() and not self._routed_to(
            occurrence.queue, template
        ):
            options["queue"] = occurrence.queue
        if producer is not None:
            options["producer"] = producer
        elif self._amqp and not self.app.conf.task_always_eager:  # see AMQP_SEND_TIMEOUT_S
            if self._unconfirmed:
                self._unconfirmed = False
                log.warning(
                    "the Celery app's broker is RabbitMQ without broker_transport_options="
                    "{'confirm_publish': True}: an occurrence counts as sent once written to "
                    "the connection, before RabbitMQ takes it (one it refuses or loses is still "
                    "counted sent); set it for at-least-once delivery"
                )
            options.setdefault("timeout", AMQP_SEND_TIMEOUT_S)  # a template's own win
            options.setdefault("confirm_timeout", AMQP_SEND_TIMEOUT_S)
        args = thaw(template.args)
        kwargs = thaw(template.kwargs)
        if task is None:  # rare: a known task pays this one test only
            if self.known_tasks_only:
                self.check_task(name)
            self.note_unknown_task(occurrence.queue, occurrence.name, name)
        try:
            if task is not None:
                task.apply_async(args, kwargs, task_id=task_id, headers=headers, **options)
            else:
                self.app.send_task(name, args, kwargs, task_id=task_id, headers=headers, **options)
        except TypeError as exc:
            if task is not None:
                _check_arguments(task, args, kwargs)  # Celery's own check refused them?
                if self.app.conf.task_always_eager:
                    _ran_eagerly(occurrence, task_id, exc)
                    return
            where = f"{occurrence.queue}/{occurrence.name}"
            raise DispatchError(f"{where}: sending {name!r} failed: {error_text(exc)}") from exc
        except Exception as exc:
            if task is not None and self.app.conf.task_always_eager:
                _ran_eagerly(occurrence, task_id, exc)
                return
            if isinstance(exc, QueueNotFound):
                # `task_create_missing_queues=False` and a queue `task_queues` lacks: no
                # retry sends it while this app's configuration stands (a lease kept per
                # slot, all sent at once after a fix): parked, as a refused argument is.
                raise PermanentDispatchError(f"its queue cannot be sent to: {exc}") from exc
            where = f"{occurrence.queue}/{occurrence.name}"
            root = _root_cause(exc)
            text = error_text(exc) if root is exc else f"{error_text(exc)} ({error_text(root)})"
            unreachable = isinstance(root, self._unreachable) or (
                root is exc and isinstance(exc, OperationalError)
            )
            failure = BrokerUnreachable if unreachable else DispatchError
            raise failure(f"{where}: sending {name!r} failed: {text}") from exc

    def _routed_to(self, queue: str, template: TaskTemplate) -> bool:
        """True when Celery's own routing of `template`'s task (`resolve_queue`, what a
        `beat_schedule` entry's registry queue is) names `queue`.

        Such a task is sent without a queue, as Celery's beat sends it, so that Celery routes
        it: a route's kombu `Queue` (its exchange, routing key and arguments), a route's
        exchange and routing key without a queue (no other queue declared), the
        `task_default_*` settings. Sent by the name alone, the name would be looked up in
        `task_queues` (or created as a direct queue) and win over the route's `Queue`.
        Otherwise (a schedule added to another queue; a route that fails) the task goes to
        `queue` by name, as before.
        """
        key = (template.task, queue)
        plain = all(type(route) is MapRoute for route in self.app.amqp.router.routes)
        if plain:
            known = self._routed.get(key)
            if known is not None:
                return known
        try:
            routed = queue == resolve_queue(
                self.app, template.task, template.options, template.args, template.kwargs
            )
        except Exception:  # a router that fails: apply_async raises it, on the old path
            routed = False
        if plain:
            if len(self._routed) >= ROUTED_CACHE_SIZE:
                self._routed.clear()
            self._routed[key] = routed
        return routed


# The commands of kombu's Redis channel that put a message in the broker (`_put`, `_put_fanout`);
# its others (`PEXPIRE`, a queue's `x-expires` refreshed) do not decide whether it is there.
_DELIVERIES = frozenset({"lpush", "publish"})


def fail_over(connection: Any, exc: BaseException) -> bool:
    """After `exc` failed a send on the kombu `connection`: when it is a connection error and
    the broker URL is a failover list (`broker_url="redis://a;redis://b"`), move the
    connection to the next URL of the list, as kombu's `Connection.ensure` does when a
    publish fails (a batch publish is not sent through it). Return whether it moved. The
    failed batch comes back through the next broker when its leases expire."""
    try:
        if len(getattr(connection, "alt", None) or ()) < 2:
            return False
        if not isinstance(exc, tuple(connection.connection_errors)):
            return False
        before = connection.as_uri()
        connection.maybe_switch_next()
        log.warning(
            "the broker at %s failed (%s: %s); sending to the next broker URL, %s",
            before,
            type(exc).__name__,
            exc,
            connection.as_uri(),
        )
    except Exception as error:  # never worse than not failing over
        log.debug("no failover to the next broker URL: %s", error)
        return False
    return True


class _RedisPublishBatch:
    """A claimed batch's messages on a Redis broker, sent in one pipeline whose every reply
    is read.

    kombu's own `Producer.batch()` (kombu 5.7) buffers them in a pipeline that is not a
    transaction: when Redis refuses one of its commands (a shared server out of memory
    refuses each `LPUSH` from the one that does not fit on), the commands before it are in,
    yet kombu raises for the whole batch, and re-sending it sent those a second time. This
    takes that batch's place on the producer (the `_batch_local.current` kombu's
    `Producer.publish` hands each message to, as `Producer.batch()` sets it) and records the
    commands kombu's Redis channel makes of each message (`_put` and `_put_fanout` give them
    to the `_publish_batch` they are passed: the same keys, the same `dumps`), with the index
    of the occurrence being sent. `send` pipelines them without retry (kombu's
    `supports_batch_publish` said so) and reads each reply, as `PipelinedCeleryDispatcher`
    does: one round trip, and exactly the occurrences Redis refused are reported failed.

    kombu internals read here: the producer's `_batch_local`, the batch protocol of
    `Producer.publish` (`publish(channel, message, **kwargs)`) and of the Redis channel
    (`basic_publish(..., _publish_batch=batch)` calling `batch.add(command, *args)`). A
    producer without them is sent one message at a time, as on RabbitMQ.
    """

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.index = -1  # the occurrence being sent (`_send_each`)
        self.channel: Any = None
        self.commands: list[tuple[int, str, tuple[Any, ...]]] = []

    @classmethod
    def install(cls, producer: Any) -> _RedisPublishBatch | None:
        """Make a batch the one `producer` publishes into (this thread); None if it cannot
        take one (a kombu whose producer batches otherwise, a batch already open)."""
        local = getattr(producer, "_batch_local", None)
        if not isinstance(local, threading.local) or getattr(local, "current", None) is not None:
            return None
        batch = cls(producer)
        local.current = batch
        return batch

    def uninstall(self) -> None:
        """Let the producer publish at once again (before it goes back to its pool)."""
        local = self.producer._batch_local
        if getattr(local, "current", None) is self:
            del local.current

    def publish(self, channel: Any, message: Any, **kwargs: Any) -> Any:
        """kombu's `Producer.publish` hands each message here: record a Redis channel's
        commands for it; another channel publishes it at once."""
        if not _takes_publish_batch(channel):
            return channel.basic_publish(message, **kwargs)
        self.channel = channel
        return channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        """kombu's Redis channel adds each command of a message here."""
        self.commands.append((self.index, name, args))

    def send(self, occurrences: Sequence[Occurrence], errors: list[BaseException | None]) -> None:
        """Pipeline the recorded commands (one round trip) and set, in `errors`, the error of
        each occurrence whose message Redis refused, or of all if the pipeline failed.

        An occurrence whose send raised after kombu made its commands (a failing hook) is
        left out: it is reported failed, so it must not be in the broker.
        """
        pending = [command for command in self.commands if errors[command[0]] is None]
        self.commands = []
        if not pending:
            return
        try:
            with (
                self.channel.conn_or_acquire() as client,
                client.pipeline(transaction=False) as pipe,
            ):
                for _, name, args in pending:
                    getattr(pipe, name)(*args)
                replies = pipe.execute(raise_on_error=False)
        except Exception as exc:  # no reply read: none of the batch is known to be in
            failure = batch_failure(exc)
            for index, _, _ in pending:
                errors[index] = failure
            fail_over(self.producer.connection, exc)
            return
        for (index, name, _), reply in zip(pending, replies, strict=True):
            if name in _DELIVERIES and isinstance(reply, Exception) and errors[index] is None:
                occurrence = occurrences[index]
                error = DispatchError(
                    f"{occurrence.queue}/{occurrence.name}: the broker did not take the "
                    f"batch's message: {type(reply).__name__}: {reply}"
                )
                error.__cause__ = reply
                errors[index] = error


def _root_cause(exc: BaseException) -> BaseException:
    """The first error of `exc`'s chain: kombu raises an `OperationalError` for what its
    publish retry gave up on, a refused message (`MessageNacked`) as well as a lost broker."""
    seen = {id(exc)}
    while (cause := exc.__cause__ or exc.__context__) is not None and id(cause) not in seen:
        seen.add(id(cause))
        exc = cause
    return exc


def _transport_of(app: Celery) -> tuple[bool, tuple[type[BaseException], ...]]:
    """Whether `app`'s broker speaks AMQP (RabbitMQ), and the errors that, first in a failed
    send's chain, say the broker was not reached (its transport's connection errors, the
    socket's): read without connecting."""
    unreachable: tuple[type[BaseException], ...] = (OSError,)
    try:
        with app.connection_for_write() as connection:
            amqp = connection.transport.driver_type == "amqp"
            return amqp, unreachable + tuple(connection.connection_errors)
    except Exception:  # a broker URL kombu cannot read fails the first send, said there
        return False, unreachable


def _takes_publish_batch(channel: Any) -> bool:
    """True for a channel of kombu's Redis transport that defers its writes to a batch (as
    kombu's own `Producer.batch()` asks it: `create_publish_batch`,
    `supports_batch_publish`)."""
    from kombu.transport.redis import Channel as RedisChannel

    return (
        isinstance(channel, RedisChannel)
        and getattr(channel, "create_publish_batch", None) is not None
        and bool(getattr(channel, "supports_batch_publish", False))
    )


# The options that say where a task goes.
ROUTING_OPTIONS = ("queue", "exchange", "routing_key")
# The (task, queue) pairs whose routing `CeleryDispatcher` keeps; cleared when full.
ROUTED_CACHE_SIZE = 10_000


def routing_option_error(options: Mapping[str, Any]) -> str | None:
    """Return why `options` cannot route a task (a `queue`, `exchange` or `routing_key` that
    is neither a name nor, for `queue` and `exchange`, the description of a kombu `Queue` or
    `Exchange`), or None. kombu would fail on every send of such a task."""
    for key in ROUTING_OPTIONS:
        value = options.get(key)
        if value is None or isinstance(value, str):
            continue
        kind = ENTITY_OPTIONS.get(key)
        if kind is not None and isinstance(value, Mapping) and KOMBU_TAG in value:
            try:
                entity_from_json(kind, value)
            except ValueError as exc:
                return f"options[{key!r}]: {exc}"
            continue
        return f"options[{key!r}] must be a name (a string), got {value!r}"
    return None


def header(request: Any, name: str) -> Any:
    """Return the header `name` of a task's request (`self.request`, or the task), or None.

    Celery's protocol 2 makes a message's headers attributes of the request; an eager
    `apply(headers=...)` keeps them in `request.headers`.
    """
    if isinstance(request, Task):
        request = request.request
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def _ms_header(request: Any, name: str) -> int | None:
    value = header(request, name)
    return None if value is None else int(value)


def _utc(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def nominal_due_ms(request: Any) -> int | None:
    """Return the nominal time (epoch ms) of the occurrence a task serves, or None.

    Pass `self.request` in a bound task (or the task itself).
    """
    return _ms_header(request, DUE_HEADER)


def nominal_time(request: Any) -> datetime | None:
    """Return the nominal time of the occurrence a task serves (aware, UTC), or None."""
    return _utc(nominal_due_ms(request))


def previous_nominal_time(request: Any) -> datetime | None:
    """Return the nominal time of the slot the registration fired before this one (aware,
    UTC), or None when there is none known (its first run; a task emq-bridge did not send).

    A slot the overlap policy skipped was not fired, so it is not the previous one.
    """
    return _utc(_ms_header(request, PREVIOUS_DUE_HEADER))


def last_success_time(request: Any) -> datetime | None:
    """Return when a run of the registration last succeeded, as its worker reported it
    (aware, UTC, the worker's clock), or None if none did (or reports are off)."""
    return _utc(_ms_header(request, LAST_SUCCESS_HEADER))


def _ran_eagerly(occurrence: Occurrence, task_id: str, exc: Exception) -> None:
    """Under `task_always_eager`, `apply_async` ran the task of `occurrence` in this process
    and touched no broker: what it raised (`task_eager_propagates`) is the task's own
    failure, not a failed send. The occurrence counts as sent (its lease acked, never sent
    again), and the error is logged once, at ERROR, as Celery's beat logs an entry whose
    `apply_async` raised (`Message Error`). The run reported itself from the task signals,
    as a worker's does (`reporting`: `failed` on `task_internal_error`, what Celery sends
    for a propagated failure)."""
    log.error(
        "%s/%s: Message Error: task %s raised in eager mode (task_always_eager), counted as "
        "sent, not sent again: %s: %s",
        occurrence.queue,
        occurrence.name,
        task_id,
        type(exc).__name__,
        exc,
        exc_info=exc,
    )


def arguments_refused(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Why `task` refuses `args` and `kwargs`, as Celery's `apply_async` checks them
    (`Task.typing`, on by default: the task's signature) before any broker I/O; None when
    it takes them, or does not check."""
    check = getattr(task, "__header__", None) if getattr(task, "typing", False) else None
    if check is None:
        return None
    try:
        check(*args, **kwargs)
    except TypeError as exc:
        return f"its args and kwargs do not fit task {task.name!r}: {exc}"
    return None


def _check_arguments(task: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise `PermanentDispatchError` if `task` refuses `args` and `kwargs`
    (`arguments_refused`): no retry can send them, so the registration is parked, where a
    retry kept its lease for ever and a fix then sent every slot held meanwhile at once.
    Asked only once a send raised a `TypeError`: the check runs again to tell Celery's
    refusal from any other. (A declaration the beat or a worker syncs is checked before: a
    registration added by other means, or by a beat whose workers' task differs, is not.)"""
    refused = arguments_refused(task, args, kwargs)
    if refused is not None:
        raise PermanentDispatchError(refused)
