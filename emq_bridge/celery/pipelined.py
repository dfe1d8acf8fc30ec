"""`PipelinedCeleryDispatcher`: the opt-in fast path to Celery on a Redis broker.

Celery spends most of a `send_task` on work that is the
same for every occurrence of a registration (routing, argument reprs, the kombu envelope).
This path lets Celery itself do that work once per registration: it sends the task through
the normal `apply_async` with a kombu channel whose final `_put` is captured instead of
pushed. The captured envelope is serialised once by kombu's own `dumps`, with marker values
where an occurrence differs (task id, root id, correlation id, delivery tag, and the
per-occurrence headers: nominal time, registration name, release time, redelivered,
triggered, previous slot, last success).
Each occurrence is then that text with its values spliced in, and a whole claimed batch is
pushed in one pipeline of `LPUSH`es to the keys kombu would push to.

It reads kombu internals that are not public API (the Redis channel's `_put`,
`_q_for_pri`, `_get_message_priority`, `_expires`), so it is tied to the kombu versions its
tests run, where a real worker consumes what it writes. Whatever it cannot reproduce exactly
goes through `CeleryDispatcher.dispatch` (the normal path), one message at a time:

* a publish signal (`before_task_publish`, `after_task_publish`, `task_sent`) has a
  receiver, or `task_send_sent_event` is on: those may change or observe each message;
* the message has an `eta` or `expires` (they are computed from the time of sending);
* the route goes to a fanout exchange, or to a queue with `x-expires`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from celery import Celery, signals
from kombu.utils import json as kombu_json

from ..dispatch import batch_failure
from ..errors import ConfigError, DispatchError
from ..occurrence import Occurrence
from .dispatch import (
    BACKFILL_HEADER,
    DUE_HEADER,
    LAST_SUCCESS_HEADER,
    PREVIOUS_DUE_HEADER,
    REDELIVERED_HEADER,
    RELEASED_HEADER,
    TRIGGERED_HEADER,
    CeleryDispatcher,
    occurrence_headers,
)

log = logging.getLogger(__name__)

# Plans kept per registration; a pump sees at most a few batches' worth at once.
PLAN_CACHE_SIZE = 10_000
_SIGNALS = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
# What kombu's Redis transport serialises an envelope with (`kombu.transport.redis._put`).
kombu_dumps: Callable[[Any], str] = kombu_json.dumps
# The values spliced into each message: the quoted ones inside a JSON string, the raw ones
# (numbers, booleans, null) as JSON values of their own; each header's name for the raw ones.
QUOTED_VALUES = ("id", "tag", "name")
RAW_HEADERS = {
    "due": DUE_HEADER,
    "released": RELEASED_HEADER,
    "redelivered": REDELIVERED_HEADER,
    "triggered": TRIGGERED_HEADER,
    "backfill": BACKFILL_HEADER,
    "previous": PREVIOUS_DUE_HEADER,
    "last_success": LAST_SUCCESS_HEADER,
}


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to write the occurrences of one registration: pieces of text between values."""

    template: Any  # the occurrence template this plan was built from (identity-checked)
    pushes: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]
    # per push: (Redis key, text pieces, value names between them)


class _Capture:
    """Stands in for a kombu Redis channel's `_put`: records the final key and message."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.puts: list[tuple[str, str, dict[str, Any]]] = []
        self.refused: str | None = None

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
        self._plans: dict[tuple[str, int], _Plan | None] = {}
        self._lock = threading.Lock()  # one plan is built at a time (the capture is shared)

    def _connect(self) -> _Capture:
        """Open the private channel whose final push is captured; return its capture."""
        if self._capture is None:
            # One attempt: a broker that is down fails this batch now, and its leases bring
            # it back later, rather than the pump waiting out kombu's connection retries.
            self._connection.ensure_connection(max_retries=1, interval_start=0)
            channel = cast(Any, self._connection.default_channel)  # kombu internals
            capture = _Capture(channel)
            # Only this private channel captures; the app's own producers are untouched.
            channel._put = capture.put
            channel._put_fanout = capture.put_fanout
            self._channel, self._producer = channel, self.app.amqp.Producer(channel)
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
        for index, occurrence in enumerate(occurrences):
            try:
                plan = self._plan(occurrence)
            except Exception as exc:  # this occurrence cannot be built; the rest go on
                errors[index] = _dispatch_error(occurrence, exc)
                continue
            if plan is None:
                errors[index] = self._send_alone(occurrence)
                continue
            values = _values(occurrence)
            for key, pieces, names in plan.pushes:
                pushes.setdefault(key, []).append(_splice(pieces, names, values))
                members.setdefault(key, []).append(index)
        if pushes:
            self._push(pushes, members, errors)
        return errors

    # -- building plans ---------------------------------------------------------------------

    def _observed(self) -> bool:
        """True when something watches each publish, which only the normal path serves."""
        if self.app.conf.task_send_sent_event:
            return True
        return any(signal.receivers for signal in _SIGNALS)

    def _plan(self, occurrence: Occurrence) -> _Plan | None:
        # Registrations that share a template (the pump shares equal definitions) share a
        # plan: the registration name is one of the spliced values.
        key = (occurrence.queue, id(occurrence.template))
        if key in self._plans:
            cached = self._plans[key]
            if cached is None or cached.template is occurrence.template:
                return cached
        with self._lock:
            plan = self._build(occurrence)
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _build(self, occurrence: Occurrence) -> _Plan | None:
        """Capture what `apply_async` writes for `occurrence`, with markers for what varies."""
        markers = {
            value: f"emq-marker-{value}-{uuid.uuid4().hex}"
            for value in (*QUOTED_VALUES, *RAW_HEADERS)
        }
        capture = self._connect()
        capture.puts, capture.refused = [], None
        # The normal path, through the capturing producer: routing, reprs, envelope.
        marked = dataclasses.replace(occurrence, name=markers["name"])
        headers = occurrence_headers(marked)
        headers.update({header: markers[value] for value, header in RAW_HEADERS.items()})
        self.fallback.send(marked, markers["id"], headers, producer=self._producer)
        puts, refused = capture.puts, capture.refused
        capture.puts = []
        if refused is not None or not puts:
            log.info(
                "%s/%s: sent through apply_async, not pipelined: %s",
                occurrence.queue,
                occurrence.name,
                refused or "nothing was routed",
            )
            return None
        pushes = []
        for _, key, message in puts:
            headers = message.get("headers") or {}
            if headers.get("eta") is not None or headers.get("expires") is not None:
                log.info(
                    "%s/%s: sent through apply_async, not pipelined: its eta/expires is "
                    "computed at sending time",
                    occurrence.queue,
                    occurrence.name,
                )
                return None
            message["properties"]["delivery_tag"] = markers["tag"]
            text = kombu_dumps(message)
            # The raw headers are numbers, booleans or null: their markers are strings until
            # spliced.
            for value in RAW_HEADERS:
                text = text.replace(f'"{markers[value]}"', markers[value])
            pieces, names = _split(text, markers)
            once = ("tag", *RAW_HEADERS)
            if any(names.count(value) != 1 for value in once) or "id" not in names:
                return None  # not the envelope expected: let apply_async send it
            pushes.append((key, pieces, names))
        return _Plan(occurrence.template, tuple(pushes))

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
            with self._channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                for key, payloads in pushes.items():
                    pipe.lpush(key, *payloads)
                replies = pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection failed: none of the batch is known to be in
            failure = batch_failure(exc)
            for indexes in members.values():
                for index in indexes:
                    errors[index] = failure
            return
        for key, reply in zip(pushes, replies, strict=True):
            if isinstance(reply, Exception):
                for index in members[key]:
                    errors[index] = errors[index] or reply

    def close(self) -> None:
        """Release the broker connection this dispatcher holds."""
        self._connection.release()


def _dispatch_error(occurrence: Occurrence, exc: Exception) -> DispatchError:
    if isinstance(exc, DispatchError):
        return exc
    error = DispatchError(
        f"{occurrence.queue}/{occurrence.name}: cannot build the message: "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error


def _split(text: str, markers: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Cut `text` at every marker: the pieces between, and which value goes in each gap."""
    by_marker = {marker: name for name, marker in markers.items()}
    pieces: list[str] = []
    names: list[str] = []
    rest = text
    while True:
        found = [(rest.find(m), m) for m in by_marker if m in rest]
        if not found:
            pieces.append(rest)
            return tuple(pieces), tuple(names)
        at, marker = min(found)
        pieces.append(rest[:at])
        names.append(by_marker[marker])
        rest = rest[at + len(marker) :]


def _values(occurrence: Occurrence) -> dict[str, str]:
    """The text spliced into the messages of `occurrence`, per value name."""
    return {
        "id": occurrence.id,
        "tag": str(uuid.uuid4()),
        "name": _json_text(occurrence.name),
        "due": str(occurrence.due_ms),
        "released": _json_value(occurrence.released_ms),
        "redelivered": _json_value(occurrence.redelivered),
        "triggered": _json_value(occurrence.triggered),
        "backfill": _json_value(occurrence.backfill),
        "previous": _json_value(occurrence.previous_due_ms),
        "last_success": _json_value(occurrence.last_success_ms),
    }


def _json_value(value: int | bool | None) -> str:
    """`value` as kombu's `dumps` writes it: `123`, `true`, `false`, `null`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(int(value))


def _json_text(value: str) -> str:
    """`value` as it appears inside a JSON string written by kombu's `dumps`."""
    if value.isascii() and '"' not in value and "\\" not in value:
        return value
    return kombu_dumps(value)[1:-1]


def _splice(pieces: tuple[str, ...], names: tuple[str, ...], values: dict[str, str]) -> str:
    parts = [pieces[0]]
    for name, piece in zip(names, pieces[1:], strict=True):
        parts.append(values[name])
        parts.append(piece)
    return "".join(parts)
