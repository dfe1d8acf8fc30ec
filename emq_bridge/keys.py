"""Every Redis key and channel name the registry uses, and the name rules.

All keys of one queue carry the `{q}` hash tag, so a queue's repeat state sits on one
Redis Cluster slot and every Lua move on it is a single atomic script.

Extra keys never take the form `<prefix>:{q}:repeat:<x>`: that space belongs to
registration records.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .errors import InvalidName
from .shown import clipped

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_NAME_BYTES",
    "QueueKeys",
    "queue_names",
    "synced_key",
    "validate_name",
]

DEFAULT_PREFIX = "emq"
# Printable ASCII without space and braces: a name made of these alone is valid.
_ASCII_NAME = re.compile(r"[!-z|~]+")
MAX_NAME_BYTES = 200


def queue_names(queues: Iterable[str]) -> tuple[str, ...]:
    """Return `queues` as a tuple of valid queue names (`InvalidName` for one that is not);
    `TypeError` for a string, which is an iterable of names too: each letter a queue."""
    if isinstance(queues, str | bytes):
        raise TypeError(f"queues must be a list of queue names, not a string: [{queues!r}]")
    return tuple(validate_name(q, "queue") for q in queues)


def is_valid_name(value: str) -> bool:
    """Whether `value` is a valid name (`validate_name`), without building an error."""
    if len(value) <= MAX_NAME_BYTES and value.isascii() and _ASCII_NAME.fullmatch(value):
        return True
    try:
        validate_name(value)
    except InvalidName:
        return False
    return True


def validate_name(value: object, what: str = "name") -> str:
    """Return `value` if it is a valid queue or registration name, else raise `InvalidName`.

    A valid name is a non-empty `str` of at most 200 bytes of UTF-8 with no `{`, `}`,
    whitespace or control characters.
    """
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidName(f"{what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:  # lone surrogates
        raise InvalidName(f"{what} {clipped(value)} is not valid UTF-8") from exc
    if size > MAX_NAME_BYTES:
        raise InvalidName(f"{what} is {size} bytes of UTF-8; the limit is {MAX_NAME_BYTES}")
    if value.isascii() and _ASCII_NAME.fullmatch(value):
        return value  # the common case, without a per-character lookup
    for char in value:
        if char in "{}":
            raise InvalidName(f"{what} {clipped(value)} must not contain '{{' or '}}'")
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Zs"):
            raise InvalidName(
                f"{what} {clipped(value)} must not contain whitespace or control characters"
            )
    return value


def validate_prefix(value: str) -> str:
    """Return `value` if it can prefix keys: the name rules, and no ':' at the end."""
    validate_name(value, "prefix")
    if value.endswith(":"):
        raise InvalidName(f"prefix {clipped(value)} must not end with ':'")
    return value


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys and channel of one queue's registry."""

    prefix: str
    queue: str

    @property
    def tag(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}"

    @property
    def registry(self) -> str:
        """Sorted set: members are registration names, scores next-run epoch ms."""
        return f"{self.tag}:repeat"

    def record(self, name: str) -> str:
        """Hash holding one registration's cadence, template and counters."""
        return f"{self.tag}:repeat:{name}"

    @property
    def leases(self) -> str:
        """Sorted set of in-flight occurrences, scored by lease deadline (see `lease_member`)."""
        return f"{self.tag}:leases"

    @property
    def generations(self) -> str:
        """Hash: source -> the highest declaration generation that source synced into the queue.

        Kept when the queue empties: it is what refuses an older generation's sync later.
        """
        return f"{self.tag}:generations"

    @property
    def synced(self) -> str:
        """Hash of the sync stamps: `<source>` -> `"<fingerprint> <counter>"`, what a sync of
        that source left here, and `{w}<source>` -> the writes of that source's records
        counted since it began stamping (stamp.lua). Kept when the queue empties."""
        return f"{self.tag}:synced"

    @property
    def running(self) -> str:
        """Sorted set of occurrences in flight on a worker, `"<name> <due_ms>[ triggered]"`,
        scored by the deadline after which they are `lost` (report.lua, lost.lua)."""
        return f"{self.tag}:running"

    def backfilled(self, name: str) -> str:
        """Sorted set of the slots backfills of `name` queued, member and score the slot
        (backfill.lua): a slot is backfilled once, whatever backfills overlap."""
        return f"{self.tag}:backfill:{name}"

    def history(self, name: str) -> str:
        """List of one registration's last occurrences, newest first (outcome.HistoryEntry)."""
        return f"{self.tag}:history:{name}"

    @property
    def pumps(self) -> str:
        """Hash: pump id -> `"<expires_ms> <beat_ms> <json>"`, the heartbeats of the pumps
        serving the queue (heartbeat.lua); the key expires with its last live pump."""
        return f"{self.tag}:pumps"

    @property
    def wake_channel(self) -> str:
        """Pub/sub channel that registry changes publish to, so sleeping pumps wake."""
        return f"{self.tag}:wake"

    def all_keys(self, names: tuple[str, ...] = ()) -> list[str]:
        return [self.registry, self.leases, *(self.record(n) for n in names)]


def synced_key(prefix: str, source: str) -> str:
    """String: JSON of the last sync of `source` that stamped the queues it read (the
    fingerprint, those queues and what its caller keeps of it: `sync.Stamp`). A key of the
    prefix, outside every queue: the stamps that make it hold are in each queue's `synced`."""
    return f"{prefix}:synced:{source}"


# The lease members: `"<name> <due_ms>"` is the lease of a scheduled occurrence,
# `"<name> <due_ms> triggered"` that of a triggered one, and `"<name> <due_ms> manual"` a
# trigger no pump has claimed yet (`trigger.lua` writes it with score 0, so it is due at once;
# `claim.lua` turns it into the "triggered" lease). Before "triggered" existed a trigger kept
# its "manual" member while leased; such a member is read as a trigger not yet sent.
# `"<name> <due_ms> buffered"` is a slot the `buffer_one` overlap policy kept, released with
# score 0 when the running occurrence finished; `claim.lua` turns it into the plain lease.
MANUAL = "manual"
TRIGGERED = "triggered"
BUFFERED = "buffered"
# `"<name> <due_ms> backfill"` is a slot `backfill.lua` queued, scored by when to send it;
# `claim.lua` turns it into the lease `"<name> <due_ms> backfilled"` (backfill.py).
BACKFILL = "backfill"
BACKFILLED = "backfilled"


class Lease(NamedTuple):
    """A parsed lease member. `pending`: a trigger or a buffered slot no pump has claimed
    (its first send)."""

    name: str
    due_ms: int
    triggered: bool
    pending: bool
    backfill: bool = False


def lease_member(name: str, due_ms: int, triggered: bool = False, backfill: bool = False) -> str:
    """Encode the lease of a claimed occurrence: `"<name> <due_ms>"`, `+ " triggered"` for a
    trigger. This is the member a pump acks.

    Names hold no whitespace, so a space separates the parts.
    """
    if backfill:
        return f"{name} {due_ms} {BACKFILLED}"
    return f"{name} {due_ms} {TRIGGERED}" if triggered else f"{name} {due_ms}"


def parse_lease_member(member: str) -> Lease:
    """Parse a lease member; ValueError if it is none of the four forms (edited by hand).

    Strict, so that a member a pump re-leases is the very member it acks afterwards.
    """
    name, due, *rest = member.split(" ")
    due_ms = int(due)
    forms: tuple[list[str], ...] = ([], [MANUAL], [TRIGGERED], [BUFFERED], [BACKFILL], [BACKFILLED])
    if not name or str(due_ms) != due or rest not in forms:
        raise ValueError(f"not a lease member: {member!r}")
    return Lease(
        name,
        due_ms,
        triggered=rest in ([MANUAL], [TRIGGERED]),
        pending=rest in ([MANUAL], [BUFFERED], [BACKFILL]),
        backfill=rest in ([BACKFILL], [BACKFILLED]),
    )
