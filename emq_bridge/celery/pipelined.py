"""`PipelinedCeleryDispatcher`: the opt-in fast path to Celery on a Redis broker.

Celery spends most of a `send_task` on work that is the same for every occurrence of a
task with the same options (routing, the kombu envelope). This path lets Celery itself do
that work once: it sends the task through the normal `apply_async` with a kombu channel
whose final `_put` is captured instead of pushed. The captured envelope is serialised once
by kombu's own `dumps`, with marker values where an occurrence differs (task id, root id,
correlation id, delivery tag, the per-occurrence headers: nominal time, registration name,
release time, redelivered, triggered, previous slot, last success; and the message body and
the `argsrepr`/`kwargsrepr` headers). That plan (`envelope.Plan`) serves every registration
with the same queue, task and options: each occurrence's body is its (args, kwargs, embed)
through the task's serializer and the channel's body encoding, its reprs Celery's
`saferepr` with `argsrepr_maxsize`/`kwargsrepr_maxsize` (`envelope.args_saferepr`: for flat
arguments of plain scalars that is `repr`, the same text), exactly as `apply_async`
computes them; the first capture of a plan checks that, and the tests compare whole
messages. A
claimed batch is pushed in one pipeline of `LPUSH`es to the keys kombu would push to.

Where anything else could depend on the arguments (a task that overrides `apply_async` or
`shadow_name`, a pydantic task, a router that is not a plain `task_routes` map, compression,
a custom `Celery`/`AMQP`/`Producer` that overrides what builds a message), a plan is one
registration's, arguments included, as a whole capture.

It reads kombu internals that are not public API (the Redis channel's `_put`,
`_q_for_pri`, `_get_message_priority`, `_expires`, `encode_body`; the producer's `_prepare`;
the serializer registry's encoders), so it is tied to the kombu versions its tests run,
where a real worker consumes what it writes. Whatever it cannot reproduce exactly goes
through `CeleryDispatcher.dispatch` (the normal path), one message at a time:

* a publish signal (`before_task_publish`, `after_task_publish`, `task_sent`) has a
  receiver (but emq-bridge's own, which marks `Task.replace()`'s message in a process that
  runs tasks), or `task_send_sent_event` is on: those may change or observe each message;
* the message has an `eta` or `expires` (made per message: an eta from the time of
  sending, a relative expires from the claim on the server's clock, `expiry.expires_at`);
* the route goes to a fanout exchange, or to a queue with `x-expires`;
* task protocol 1 (the task id is inside the body);
* eager mode (`task_always_eager`, a test): `apply_async` runs the task in this process and
  publishes nothing, so each occurrence runs once, through the normal path;
* an occurrence whose args a typed task refuses, or its serializer cannot encode: the
  normal path raises the error it raises.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, cast

from celery import Celery, Task, signals
from celery.app.amqp import AMQP
from celery.app.routes import MapRoute, Router
from kombu.messaging import Producer
from kombu.serialization import registry as serializers

from ..dispatch import batch_failure
from ..errors import ConfigError, DispatchError
from ..occurrence import Occurrence
from ..template import FrozenDict, FrozenList, TaskTemplate
from .dispatch import CeleryDispatcher, fail_over, occurrence_headers
from .envelope import (
    ARGS_VALUES,
    RAW_HEADERS,
    ArgsCodec,
    Plan,
    delivery_tags,
    fast_encoder,
    json_text,
    new_markers,
    occurrence_values,
    plan_pushes,
)
from .replacement import PUBLISH_RECEIVER_UID

log = logging.getLogger(__name__)

# Plans kept (per queue, task and options; or per template where the arguments shape the
# whole message), and the args-dependent parts kept per shared template: both cleared when
# full, so memory stays bounded whatever the registry holds.
PLAN_CACHE_SIZE = 10_000
PARTS_CACHE_SIZE = 10_000
_SIGNALS = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
_PER_TEMPLATE = object()  # a skeleton key's entry: its task needs a plan per template
_MISSING = object()
_UNBUILT = object()  # the capture raised: send that occurrence alone, remember nothing
_NO_PARTS = ("", "", "")  # the args-dependent parts of a plan that holds them in its text


class _Capture:
    """Stands in for a kombu Redis channel's `_put` and the producer's `_prepare`: records
    the final key and message, and how the body was serialised."""

    def __init__(self, channel: Any, producer: Any) -> None:
        self.channel = channel
        self.producer = producer
        self.prepare = producer._prepare  # kombu's own, called through
        self.puts: list[tuple[str, str, dict[str, Any]]] = []
        self.prepared: list[tuple[Any, str | None, Any, Any]] = []
        self.refused: str | None = None

    def reset(self) -> None:
        self.puts, self.prepared, self.refused = [], [], None

    def put(self, queue: str, message: dict[str, Any], **_: Any) -> None:
        channel = self.channel
        if channel._expires and queue in channel._expires:
            self.refused = f"queue {queue!r} has x-expires"
        priority = channel._get_message_priority(message, reverse=False)
        self.puts.append((queue, channel._q_for_pri(queue, priority), message))

    def put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **_: Any
    ) -> None:
        self.refused = f"exchange {exchange!r} is a fanout exchange"

    def prepare_body(
        self,
        body: Any,
        serializer: str | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        compression: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> Any:
        used = serializer or self.producer.serializer
        self.prepared.append((body, used, content_type, compression))
        return self.prepare(body, serializer, content_type, content_encoding, compression, headers)


class PipelinedCeleryDispatcher:
    """Opt-in fast path on a Redis broker: a claimed batch is one pipeline of `LPUSH`es.

    Each message is byte for byte what `apply_async` writes for that occurrence (tested
    against it, and consumed by a real worker), except the random delivery tag. See the
    module docstring for what falls back to the normal path.
    """

    def __init__(self, app: Celery) -> None:
        from kombu.transport.redis import Transport as RedisTransport

        self.app = app
        self.fallback = CeleryDispatcher(app)
        # Not connected yet (that happens at the first batch, so a broker that is down at
        # start is retried like any send); the transport class is known already.
        self._connection = app.connection_for_write()
        if not isinstance(self._connection.transport, RedisTransport):
            transport = self._connection.transport_cls
            self._connection.release()
            raise ConfigError(
                "PipelinedCeleryDispatcher needs a Redis broker (redis://, rediss://), got "
                f"{transport!r}; use CeleryDispatcher"
            )
        self._channel: Any = None
        self._capture: _Capture | None = None
        self._producer: Any = None
        # (queue, task, options JSON) -> a skeleton plan, None (never pipelined) or
        # _PER_TEMPLATE; (queue, id(template)) -> a one-template plan or None.
        self._plans: dict[Hashable, Any] = {}
        # (queue, id(template)) -> (template, plan key, parts), for templates the pump shares.
        self._parts: dict[tuple[str, int], tuple[Any, Hashable, tuple[str, str, str]]] = {}
        self._lock = threading.Lock()  # one plan is built at a time (the capture is shared)

    def expiry_ms(self, template: Mapping[str, Any]) -> int | None:
        """`CeleryDispatcher.expiry_ms` (a task with `expires` is sent on that path, which
        dates a relative one from the claim, on the server's clock)."""
        return self.fallback.expiry_ms(template)

    def _connect(self) -> _Capture:
        """Open the private channel whose final push is captured; return its capture."""
        if self._capture is None:
            # One attempt: a broker that is down fails this batch now, and its leases bring
            # it back later, rather than the pump waiting out kombu's connection retries.
            self._connection.ensure_connection(max_retries=1, interval_start=0)
            channel = cast(Any, self._connection.default_channel)  # kombu internals
            producer = self.app.amqp.Producer(channel)
            capture = _Capture(channel, producer)
            # Only this private channel and producer capture; the app's own are untouched.
            channel._put = capture.put
            channel._put_fanout = capture.put_fanout
            producer._prepare = capture.prepare_body
            self._channel, self._producer = channel, producer
            self._capture = capture
        return self._capture

    def dispatch(self, occurrence: Occurrence) -> None:
        """Send one occurrence (the whole path, one round trip)."""
        error = self.dispatch_batch([occurrence])[0]
        if error is not None:
            raise error

    def revoke(self, occurrence_id: str) -> None:
        """Revoke the task of `occurrence_id`, terminating it if it runs (as
        `CeleryDispatcher.revoke`: a control broadcast, not pipelined)."""
        self.fallback.revoke(occurrence_id)

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        """Send `occurrences` in one pipeline; return None or the error of each."""
        errors: list[BaseException | None] = [None] * len(occurrences)
        if self._observed():
            for index, occurrence in enumerate(occurrences):
                errors[index] = self._send_alone(occurrence)
            return errors
        pushes: dict[str, list[str]] = {}
        members: dict[str, list[int]] = {}
        tags = delivery_tags(len(occurrences))
        for index, occurrence in enumerate(occurrences):
            try:
                plan, parts = self._plan(occurrence)
            except Exception as exc:  # this occurrence cannot be built; the rest go on
                errors[index] = _dispatch_error(occurrence, exc)
                continue
            if plan is None:
                errors[index] = self._send_alone(occurrence)
                continue
            for key, text in plan.texts(occurrence_values(occurrence, parts, tags[index])):
                pushes.setdefault(key, []).append(text)
                members.setdefault(key, []).append(index)
        if pushes:
            self._push(pushes, members, errors)
        return errors

    # -- finding plans ----------------------------------------------------------------------

    def _observed(self) -> bool:
        """True when each occurrence must go through the normal path: something watches each
        publish, or eager mode (`task_always_eager`), where `apply_async` runs the task in
        this process instead of publishing it (a capture would run it, under marker values,
        and capture nothing)."""
        conf = self.app.conf
        if conf.task_send_sent_event or conf.task_always_eager:
            return True
        # emq-bridge's own receiver (`replacement.PUBLISH_RECEIVER_UID`, connected where tasks
        # run) acts only on a message a running task sends with its own id (`Task.replace()`):
        # never one of these.
        return any(
            key[0] != PUBLISH_RECEIVER_UID for signal in _SIGNALS for key, _ in signal.receivers
        )

    def _plan(self, occurrence: Occurrence) -> tuple[Plan | None, tuple[str, str, str]]:
        """Return the plan of `occurrence` and its args-dependent parts; a None plan sends
        it through the normal path (which raises what it raises)."""
        template = occurrence.template
        memo = (occurrence.queue, id(template))
        known = self._parts.get(memo)
        if known is not None and known[0] is template:
            plan = self._plans.get(known[1])
            if isinstance(plan, Plan) and (plan.codec is not None or plan.template is template):
                return plan, known[2]
        try:
            read = TaskTemplate.read(template)
        except Exception:
            return None, _NO_PARTS  # the normal path raises its PermanentDispatchError
        try:
            # No options is the common case: its text without a call to `json.dumps`.
            options = json.dumps(read.options) if read.options else "{}"
            key: Hashable = (occurrence.queue, read.task, options)
        except (TypeError, ValueError):  # options that are not JSON: a plan per template
            key = None
        if key is not None:
            entry = self._plans.get(key, _MISSING)
            if entry is _MISSING:
                entry = self._build(occurrence, read, skeleton=True)
                if entry is _UNBUILT:
                    return None, _NO_PARTS
                self._remember(key, entry)
            if isinstance(entry, Plan) and entry.codec is not None:
                try:
                    parts = entry.codec.parts(list(read.args), dict(read.kwargs))
                except Exception:  # Celery refuses these arguments: let it say so
                    return None, _NO_PARTS
                self._memo(memo, template, read, key, parts)
                return entry, parts
            if entry is not _PER_TEMPLATE:
                return None, _NO_PARTS
        # A plan of this template alone (its arguments are part of the text).
        key = (occurrence.queue, id(template))
        cached = self._plans.get(key, _MISSING)
        if cached is _MISSING or (isinstance(cached, Plan) and cached.template is not template):
            cached = self._build(occurrence, read, skeleton=False)
            if cached is _UNBUILT:
                return None, _NO_PARTS
            self._remember(key, cached)
        if not isinstance(cached, Plan):
            return None, _NO_PARTS
        self._memo(memo, template, read, key, _NO_PARTS)
        return cached, _NO_PARTS

    def _remember(self, key: Hashable, entry: Any) -> Any:
        if len(self._plans) >= PLAN_CACHE_SIZE:
            self._plans.clear()
        self._plans[key] = entry
        return entry

    def _memo(
        self,
        memo: tuple[str, int],
        template: Any,
        read: TaskTemplate,
        key: Hashable,
        parts: tuple[str, str, str],
    ) -> None:
        """Remember `parts` for a template the pump shares between occurrences (read-only
        all the way down, so its identity says its content)."""
        if not isinstance(template, FrozenDict):
            return
        args_frozen = not read.args or isinstance(read.args, FrozenList)
        if not (args_frozen and (not read.kwargs or isinstance(read.kwargs, FrozenDict))):
            return
        if len(self._parts) >= PARTS_CACHE_SIZE:
            self._parts.clear()
        self._parts[memo] = (template, key, parts)

    # -- building plans ---------------------------------------------------------------------

    def _build(self, occurrence: Occurrence, read: TaskTemplate, skeleton: bool) -> Any:
        """Capture what `apply_async` writes for `occurrence`, with markers for what varies;
        return its plan, None (never pipelined), `_PER_TEMPLATE` (for a skeleton whose
        task's messages depend on their arguments beyond the body and reprs) or `_UNBUILT`
        (`apply_async` raised: this occurrence goes alone, to fail with its own name)."""
        where = f"{occurrence.queue}/{occurrence.name}"
        if self.app.conf.task_protocol != 2:
            log.info("%s: sent through apply_async, not pipelined: task protocol 1", where)
            return None
        # A task the app lacks is told of here, by the registration's real name: the capture
        # below sends under a marker name, and the plan's later sends skip `send` entirely.
        if self.app.tasks.get(read.task) is None:
            self.fallback.note_unknown_task(occurrence.queue, occurrence.name, read.task)
        with self._lock:
            capture = self._connect()
            markers = new_markers()
            capture.reset()
            # The normal path, through the capturing producer: routing, reprs, envelope.
            marked = dataclasses.replace(occurrence, name=markers["name"])
            headers = occurrence_headers(marked)
            headers.update({header: markers[value] for value, header in RAW_HEADERS.items()})
            try:
                self.fallback.send(marked, markers["id"], headers, producer=self._producer)
                puts, prepared, refused = capture.puts, capture.prepared, capture.refused
            except Exception:  # Celery refuses this one: the normal path says why, by name
                return _UNBUILT
            finally:
                capture.reset()
        refused = refused or ("nothing was routed" if not puts else None) or _sent_at(puts)
        if refused is not None:
            log.info("%s: sent through apply_async, not pipelined: %s", where, refused)
            return None
        for _, _, message in puts:
            message["properties"]["delivery_tag"] = markers["tag"]
        spliced = {"id", "tag", "name", *RAW_HEADERS}
        codec = None
        if skeleton:
            codec, why = self._codec(read, puts, prepared)
            if codec is None:
                log.debug("%s: a pipelined plan per template: %s", where, why)
                return _PER_TEMPLATE
            for _, _, message in puts:
                message["body"] = markers["body"]
                if codec.argsrepr is not None:
                    message["headers"]["argsrepr"] = markers["argsrepr"]
                if codec.kwargsrepr is not None:
                    message["headers"]["kwargsrepr"] = markers["kwargsrepr"]
            spliced.add("body")
            spliced.update(name for name in ARGS_VALUES[1:] if getattr(codec, name) is not None)
        pushes = plan_pushes([(key, message) for _, key, message in puts], markers, spliced)
        if pushes is None:
            log.info("%s: sent through apply_async, not pipelined: an unexpected envelope", where)
            return None
        return Plan(pushes, codec, None if skeleton else occurrence.template)

    def _codec(
        self,
        read: TaskTemplate,
        puts: Sequence[tuple[str, str, dict[str, Any]]],
        prepared: Sequence[tuple[Any, str | None, Any, Any]],
    ) -> tuple[ArgsCodec | None, str]:
        """Return how this capture's args-dependent parts are made per occurrence, checked
        against the capture itself; or None and why the arguments shape more than those."""
        app = self.app
        task = app.tasks.get(read.task)
        bound = _arguments_shape_more(app, task, self._producer)
        if bound is not None:
            return None, bound
        if len(prepared) != 1:
            return None, "the message was serialised more than once"
        body, serializer, content_type, compression = prepared[0]
        if content_type is not None or compression:
            return None, "a compressed or pre-serialised body"
        encoder = serializers._encoders.get(serializer) if serializer != "raw" else None
        if encoder is None or not isinstance(body, tuple) or len(body) != 3:
            return None, f"serializer {serializer!r} or body not as expected"
        levels = app.conf.task_repr_maxlevels
        options = read.options
        encode_body = _body_encoder(self._channel)
        codec = ArgsCodec(
            check=getattr(task, "__header__", None) if task is not None and task.typing else None,
            encoder=fast_encoder(encoder.encoder),
            encode_body=encode_body,
            embed=dict(body[2]),
            argsrepr=None
            if options.get("argsrepr") is not None
            else (app.amqp.argsrepr_maxsize, levels),
            kwargsrepr=None
            if options.get("kwargsrepr") is not None
            else (app.amqp.kwargsrepr_maxsize, levels),
        )
        # The capture must be what the codec makes of the same arguments.
        args, kwargs = list(read.args), dict(read.kwargs)
        if body[0] != (args or ()) or type(body[0]) is not type(args or ()):
            return None, "the task's arguments were changed on their way"
        if body[1] != kwargs or type(body[1]) is not dict:
            return None, "the task's keyword arguments were changed on their way"
        try:
            parts = codec.parts(args, kwargs)
        except Exception as exc:
            return None, f"its arguments do not encode alone: {exc}"
        for _, _, message in puts:
            headers = message.get("headers") or {}
            made = [message.get("body"), headers.get("argsrepr"), headers.get("kwargsrepr")]
            texts = [value for value in made if isinstance(value, str)]
            if len(texts) != len(made):
                return None, "a body or repr that is not text"
            if (
                message.get("content-type") != encoder.content_type
                or message.get("content-encoding") != encoder.content_encoding
            ):
                return None, "the content type is not the serializer's"
            checked = (True, codec.argsrepr is not None, codec.kwargsrepr is not None)
            for name, check, got, value in zip(ARGS_VALUES, checked, parts, texts, strict=True):
                if check and got != json_text(value):
                    return None, f"its {name} is not what Celery made"
        return codec, ""

    # -- sending ----------------------------------------------------------------------------

    def _send_alone(self, occurrence: Occurrence) -> BaseException | None:
        try:
            self.fallback.dispatch(occurrence)
        except Exception as exc:
            return exc
        return None

    def _push(
        self,
        pushes: dict[str, list[str]],
        members: dict[str, list[int]],
        errors: list[BaseException | None],
    ) -> None:
        # LPUSH k a b c leaves c at the head, as three LPUSHes would: consumers (BRPOP) get a
        # first. One command per key; kombu's client adds its global_keyprefix, if any.
        try:
            with self._lock:
                self._connect()  # again after a failover to the next broker URL
                channel = self._channel
            with channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                for key, payloads in pushes.items():
                    pipe.lpush(key, *payloads)
                replies = pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection failed: none of the batch is known to be in
            failure = batch_failure(exc)
            for indexes in members.values():
                for index in indexes:
                    errors[index] = failure
            if fail_over(self._connection, exc):
                with self._lock:  # the next push opens a channel to the next broker URL
                    self._capture = self._channel = self._producer = None
            return
        for key, reply in zip(pushes, replies, strict=True):
            if isinstance(reply, Exception):
                for index in members[key]:
                    errors[index] = errors[index] or reply

    def close(self) -> None:
        """Release the broker connection this dispatcher holds."""
        self._connection.release()


def _sent_at(puts: Sequence[tuple[str, str, dict[str, Any]]]) -> str | None:
    """Say why a captured message cannot be replayed later, if it cannot."""
    for _, _, message in puts:
        headers = message.get("headers") or {}
        if headers.get("eta") is not None or headers.get("expires") is not None:
            return "its eta/expires is computed at sending time"
    return None


def _body_encoder(channel: Any) -> Callable[[Any], Any]:
    """Return how `channel` encodes a message body (`encode_body`): for kombu's base64 (the
    Redis transport's), the same text without kombu's lookups on every call."""
    from kombu.transport.virtual.base import Base64
    from kombu.transport.virtual.base import Channel as VirtualChannel

    encoding = channel.body_encoding
    codec = channel.codecs.get(encoding) if encoding else None
    kombu_base64 = type(codec) is Base64 and encoding.lower() != "utf-8"
    if kombu_base64 and type(channel).encode_body is VirtualChannel.encode_body:

        def base64(payload: Any) -> Any:  # Base64.encode: str_to_bytes, b64, bytes_to_str
            raw = payload.encode() if isinstance(payload, str) else payload
            return binascii.b2a_base64(raw, newline=False).decode(errors="replace")

        return base64

    def encode_body(payload: Any) -> Any:
        return channel.encode_body(payload, encoding)[0]

    return encode_body


def _arguments_shape_more(app: Celery, task: Any, producer: Any) -> str | None:
    """Say what could make a message depend on its arguments beyond the body and reprs
    (an override of what builds messages, a router function, ...), or None."""
    amqp = app.amqp
    if type(app).send_task is not Celery.send_task:
        return "the app overrides send_task"
    if (
        type(amqp).as_task_v2 is not AMQP.as_task_v2
        or type(amqp)._create_task_sender is not AMQP._create_task_sender
    ):
        return "the app's AMQP class overrides how messages are built"
    router = amqp.router
    if type(router) is not Router or any(type(route) is not MapRoute for route in router.routes):
        return "a router that may read the arguments"
    if type(producer).publish is not Producer.publish or type(producer)._prepare is not (
        Producer._prepare
    ):
        return "the producer class overrides publish"
    if task is not None:
        kind = type(task)
        if kind.apply_async is not Task.apply_async:
            return "the task overrides apply_async"
        if kind.shadow_name is not Task.shadow_name:
            return "the task has a shadow_name"
        if getattr(task, "_dump_pydantic_arguments", None) is not None:
            return "a pydantic task"
    return None


def _dispatch_error(occurrence: Occurrence, exc: Exception) -> DispatchError:
    if isinstance(exc, DispatchError):
        return exc
    error = DispatchError(
        f"{occurrence.queue}/{occurrence.name}: cannot build the message: "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error
