"""Plans of the pipelined Celery path: a captured kombu envelope as text with gaps.

`PipelinedCeleryDispatcher` captures what `apply_async` writes for one occurrence, with
marker values where occurrences differ; `plan_pushes` cuts kombu's serialised text at the
markers. Each later occurrence is that text with its own values in the gaps (`Plan.texts`).

A plan is either one registration's (`codec` is None: the arguments are part of the text)
or a skeleton shared by every registration with the same queue, task and options (`codec`
computes the message body and the `argsrepr`/`kwargsrepr` headers per occurrence, with the
functions Celery and kombu use for them, `ArgsCodec.parts`).
"""

from __future__ import annotations

import json
import operator
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery.utils.saferepr import saferepr
from kombu.utils import json as kombu_json

from ..direct_json import direct_encoder
from ..occurrence import Occurrence
from .dispatch import (
    BACKFILL_HEADER,
    DUE_HEADER,
    GUARDED_HEADER,
    LAST_SUCCESS_HEADER,
    PREVIOUS_DUE_HEADER,
    REDELIVERED_HEADER,
    RELEASED_HEADER,
    TRIGGERED_HEADER,
)

# What kombu's Redis transport serialises an envelope with (`kombu.transport.redis._put`).
kombu_dumps: Callable[[Any], str] = kombu_json.dumps

# The values spliced into each message. Quoted ones sit inside a JSON string (escaped as
# kombu's `dumps` escapes them); raw ones (numbers, booleans, null) are JSON values of their
# own, each the value of the header named here. `ARGS_VALUES` depend on args/kwargs.
QUOTED_VALUES = ("id", "tag", "name")
RAW_HEADERS = {
    "due": DUE_HEADER,
    "released": RELEASED_HEADER,
    "redelivered": REDELIVERED_HEADER,
    "triggered": TRIGGERED_HEADER,
    "backfill": BACKFILL_HEADER,
    "previous": PREVIOUS_DUE_HEADER,
    "last_success": LAST_SUCCESS_HEADER,
    "guarded": GUARDED_HEADER,
}
ARGS_VALUES = ("body", "argsrepr", "kwargsrepr")
VALUE_NAMES = (*QUOTED_VALUES, *RAW_HEADERS, *ARGS_VALUES)
_INDEX = {name: index for index, name in enumerate(VALUE_NAMES)}


def new_markers() -> dict[str, str]:
    """Return a unique marker string per value name, for one capture."""
    return {value: f"emq-marker-{value}-{uuid.uuid4().hex}" for value in VALUE_NAMES}


@dataclass(frozen=True, slots=True)
class ArgsCodec:
    """How the parts of a message that depend on args/kwargs are made, as Celery makes them.

    `check` is the task's signature check (`Task.apply_async` calls it when the task is
    typed), `encoder` the serializer's (kombu's registry), `encode_body` the channel's body
    encoding (base64 on Redis), `embed` the body's third part (callbacks, errbacks, chain,
    chord: the same for every occurrence). A repr is None when the options give it.
    """

    check: Callable[..., object] | None
    encoder: Callable[[Any], Any]
    encode_body: Callable[[Any], Any]
    embed: Mapping[str, Any]
    argsrepr: tuple[int | None, int | None] | None  # (maxsize, maxlevels) for saferepr
    kwargsrepr: tuple[int | None, int | None] | None

    def parts(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, str, str]:
        """Return (body, argsrepr, kwargsrepr) as they appear in the JSON envelope.

        Raises what Celery would raise on the same call (a signature mismatch, a value the
        serializer refuses), or `ValueError` if the body is not text.
        """
        if self.check is not None:
            self.check(*args, **kwargs)
        # As `AMQP.as_task_v2`: empty args become (), which reprs as "()".
        sent_args: list[Any] | tuple[()] = args or ()
        sent_kwargs = kwargs or {}
        body = self.encode_body(self.encoder((sent_args, sent_kwargs, self.embed)))
        if not isinstance(body, str):
            raise ValueError("the encoded body is not text")
        argsrepr = kwargsrepr = ""
        if self.argsrepr is not None:
            argsrepr = json_text(args_saferepr(sent_args, *self.argsrepr))
        if self.kwargsrepr is not None:
            kwargsrepr = json_text(args_saferepr(sent_kwargs, *self.kwargsrepr))
        return json_text(body), argsrepr, kwargsrepr


_SCALARS = frozenset({int, float, bool, type(None)})


def args_saferepr(
    value: list[Any] | tuple[()] | dict[str, Any], maxlen: int | None, levels: int | None
) -> str:
    """Return `saferepr(value, maxlen, maxlevels=levels)`, as `AMQP.as_task_v2` reprs args.

    Celery's saferepr walks a token stream in Python, the dearest part of a message. For a
    flat list or dict of plain scalars (int, float, bool, None, and strings that are
    printable with no quote or backslash) whose `repr` fits in `maxlen`, it writes exactly
    `repr(value)`: every token is shown whole (each is followed by a closing bracket, so
    none reaches the limit), numbers as `str` (equal to `repr` for these types), strings
    quoted as `repr` quotes them, and a flat container is never deeper than `levels`.
    Anything else goes through saferepr itself (the tests compare both on many values).
    """
    if levels is not None and levels < 0:  # a negative depth elides even the outermost
        return _celery_saferepr(value, maxlen, levels)
    # One loop over keys and values, no generator: this runs twice for every message.
    items: Iterable[Any] = value
    if type(value) is dict:
        for key in value:
            if type(key) is not str or not _plain(key):
                return _celery_saferepr(value, maxlen, levels)
        items = value.values()
    for item in items:
        kind = type(item)
        if kind is str:
            if not _plain(item):
                return _celery_saferepr(value, maxlen, levels)
        elif kind not in _SCALARS:
            return _celery_saferepr(value, maxlen, levels)
    text = repr(value)
    if maxlen is not None and len(text) > maxlen:
        return _celery_saferepr(value, maxlen, levels)
    return text


def _celery_saferepr(value: Any, maxlen: int | None, levels: int | None) -> str:
    text: str = saferepr(value, maxlen, maxlevels=levels)
    return text


def _plain(text: str) -> bool:
    """True when `repr(text)` is the text between single quotes, as saferepr writes it."""
    return text.isprintable() and "'" not in text and "\\" not in text


@dataclass(frozen=True, slots=True)
class Push:
    """One `LPUSH` of a plan: the Redis list and the envelope as a %-format of the values."""

    key: str
    text: str
    pick: Callable[[Sequence[str]], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Plan:
    """How to write an occurrence: its pushes, and how its args-dependent parts are made."""

    pushes: tuple[Push, ...]
    codec: ArgsCodec | None  # None: the args are in the text (a plan of one template)
    template: Any = None  # the template of a one-template plan (identity-checked)

    def texts(self, values: Sequence[str]) -> list[tuple[str, str]]:
        """Return (key, message) per push, `values` in `VALUE_NAMES` order."""
        return [(push.key, push.text % push.pick(values)) for push in self.pushes]


def plan_pushes(
    puts: Sequence[tuple[str, dict[str, Any]]], markers: Mapping[str, str], spliced: set[str]
) -> tuple[Push, ...] | None:
    """Return the pushes of captured `puts` (key, message with the markers of `spliced` in
    place), or None when the text is not the envelope expected."""
    pushes = []
    raw = {markers[value] for value in RAW_HEADERS}
    for key, message in puts:
        text = kombu_dumps(message)
        # The raw headers are numbers, booleans or null: their markers are strings until
        # spliced.
        for marker in raw:
            text = text.replace(f'"{marker}"', marker)
        pieces, names = _split(text, {v: m for v, m in markers.items() if v in spliced})
        once = ("tag", *RAW_HEADERS, *(spliced & set(ARGS_VALUES)))
        if any(names.count(value) != 1 for value in once) or "id" not in names:
            return None
        fmt = "%s".join(piece.replace("%", "%%") for piece in pieces)
        indexes = [_INDEX[name] for name in names]
        pick = operator.itemgetter(*indexes) if len(indexes) > 1 else _single(indexes[0])
        pushes.append(Push(key, fmt, pick))
    return tuple(pushes)


def _single(index: int) -> Callable[[Sequence[str]], tuple[str, ...]]:
    return lambda values: (values[index],)


def _split(text: str, markers: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
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


def fast_encoder(encoder: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Return `encoder`, or for kombu's JSON `dumps` an encoder that writes the same text.

    `dumps` builds a `JSONEncoder` with its defaults on every call, and its `encode` builds
    the C encoder on every call too: here it is built once (`direct_encoder`, checked
    against that encoder on probes). No circular-reference check: a body decoded from a
    template has no cycle, and one that had would fail with RecursionError (then the normal
    path sends it, and says why).
    """
    if encoder is kombu_json.dumps and kombu_json.dumps.__defaults__ == (
        json.dumps,
        kombu_json.JSONEncoder,
        None,
    ):
        return direct_encoder(kombu_json.JSONEncoder(), check_circular=False)
    return encoder


def delivery_tag() -> str:
    """Return a random UUID4 as text, as kombu's `uuid()` makes a delivery tag, faster."""
    return delivery_tags(1)[0]


_VARIANT = {f"{n:x}": "89ab"[n & 3] for n in range(16)}


def delivery_tags(count: int) -> list[str]:
    """Return `count` delivery tags (`delivery_tag`) from one read of the OS's random source,
    instead of a system call per message."""
    raw = os.urandom(16 * count).hex()
    tags = []
    for at in range(0, 32 * count, 32):
        h = raw[at : at + 32]
        tags.append(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}")
    return tags


def occurrence_values(
    occurrence: Occurrence, parts: tuple[str, str, str], tag: str | None = None
) -> tuple[str, ...]:
    """Return the text spliced into the messages of `occurrence`, in `VALUE_NAMES` order;
    `tag` is its delivery tag (a new one if None)."""
    return (
        occurrence.id,
        delivery_tag() if tag is None else tag,
        json_text(occurrence.name),
        str(occurrence.due_ms),
        json_value(occurrence.released_ms),
        json_value(occurrence.redelivered),
        json_value(occurrence.triggered),
        json_value(occurrence.backfill),
        json_value(occurrence.previous_due_ms),
        json_value(occurrence.last_success_ms),
        json_value(occurrence.guarded),
        *parts,
    )


def json_value(value: int | bool | None) -> str:
    """`value` as kombu's `dumps` writes it: `123`, `true`, `false`, `null`."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(int(value))


def json_text(value: str) -> str:
    """`value` as it appears inside a JSON string written by kombu's `dumps`."""
    # Printable ASCII but the quote and backslash is written as it is; anything else
    # (control characters, non-ASCII) is escaped by the encoder itself.
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return value
    return kombu_dumps(value)[1:-1]
