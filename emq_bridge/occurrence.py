"""An occurrence: one firing of a registration, and the id every pump derives for it.

An inert value, importable without the registry: dispatchers, events and the adapters
need it, not the moves.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import lease_member

__all__ = ["Occurrence", "is_occurrence_id", "occurrence_id"]

_OCCURRENCE_NAMESPACE = uuid.UUID("6f1c6c2e-3b0e-5d7a-9a57-8c1f3f4b2e10")
_NAMESPACE_BYTES = _OCCURRENCE_NAMESPACE.bytes


def occurrence_id(
    prefix: str, queue: str, name: str, due_ms: int, *, triggered: bool = False
) -> str:
    """Return the id of the occurrence of `name` due at `due_ms`: a UUIDv5, the same every time.

    A re-dispatch after a crash, or a racing pump, therefore produces the same id. Names may
    hold ':', so it is escaped: queue "a:b" + name "c" and queue "a" + name "b:c" differ.
    A manual trigger is its own occurrence, even in the millisecond of a scheduled slot.
    """
    seed = f"{_escape(prefix)}:{_escape(queue)}:{_escape(name)}:{due_ms}"
    return _uuid5(f"{seed}:manual" if triggered else seed)


def is_occurrence_id(
    ident: str, prefix: str, queue: str, name: str, due_ms: int, *, triggered: bool = False
) -> bool:
    """Whether `ident` is the id a pump of the registry under `prefix` gives the occurrence
    of `name` due at `due_ms`: what tells a message a pump sent from one that only carries
    its headers or options (copied onto a child task by user code, a fan-out copy under a
    new id, a message of another deployment's prefix, a forged one)."""
    return ident == occurrence_id(prefix, queue, name, due_ms, triggered=triggered)


def _escape(part: str) -> str:
    if ":" not in part and "\\" not in part:  # the common case, without two str.replace
        return part
    return part.replace("\\", "\\\\").replace(":", "\\:")


def _uuid5(seed: str) -> str:
    """`str(uuid.uuid5(_OCCURRENCE_NAMESPACE, seed))`, without building a `UUID` object.

    The pump computes one per occurrence; this is several times cheaper and equal (tested).
    """
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + seed.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One firing of a registration at its nominal instant `due_ms` (epoch ms, UTC).

    `template` is shared by the occurrences of a registration, so it is read-only (a
    `FrozenDict`; changing it raises `TypeError`): change a copy, `copy.deepcopy(template)`
    (`dict(template)` is shallow: its nested `kwargs`, `args` stay read-only).
    `released_ms` is when the pump claimed it, on the server's clock. `previous_due_ms` is
    the slot the registration fired before this one and `last_success_ms` when a worker last
    reported one of its occurrences succeeded (None when unknown): the previous-run context
    a task sees (Temporal's last completion, sidekiq-cron's date argument).
    """

    queue: str
    name: str
    due_ms: int
    id: str
    template: Mapping[str, Any]
    released_ms: int
    redelivered: bool = False
    missed: int = 0
    triggered: bool = False
    previous_due_ms: int | None = None
    last_success_ms: int | None = None
    # Sent by a backfill (backfill.py) for a past slot, with the id the live slot has.
    backfill: bool = False
    # Its registration has an overlap policy (not `allow`) and it is a slot, not a trigger or
    # a backfill: a worker asks `Repeat.begin` before it runs it (lua/begin.lua).
    guarded: bool = False
    # The instant the pump was to send it, when that is not `due_ms`: a jittered slot's
    # jittered instant (jitter.py). Not in its message: what the pump's lag is measured from.
    send_at_ms: int | None = None

    @property
    def lease_member(self) -> str:
        return lease_member(self.name, self.due_ms, self.triggered, self.backfill)
