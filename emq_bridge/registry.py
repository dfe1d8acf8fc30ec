"""`Repeat`: the Repeat registry. The only module that talks to the registry keys.

Every move is one Lua script (see `emq_bridge/lua/`). Redis connection failures surface as
`RegistryUnavailable`, other server errors as `RegistryError`; nothing is swallowed.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import itertools
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import redis
import redis.cluster

from .arguments import whole_arg
from .backfill import BackfillMoves
from .bounds import COMPLETED_REASONS, Completed, Instant, bounded_runs
from .cadence import LATEST_MS, NEVER_MS, Anchor, Misfire, advance, catch_up, now_arg
from .calendars import Excluding
from .definition import (
    DEFINITION_FIELDS,
    Declaration,
    Definition,
    Offset,
    Overlap,
    definition_or_define,
    shape_key,
)
from .errors import (
    ConfigError,
    CorruptRecord,
    RegistryError,
    RegistryUnavailable,
    ScheduleError,
    UnknownRegistration,
)
from .heartbeat import HeartbeatMoves
from .jitter import Jittered, immediate_at, nominal_slot, pending_slot
from .keys import (
    BACKFILL,
    DEFAULT_PREFIX,
    QueueKeys,
    is_valid_name,
    parse_lease_member,
    validate_name,
    validate_prefix,
)
from .lifecycle import GUARDED_MODES, START_TIMEOUT_MS, LifecycleMoves
from .occurrence import Occurrence, occurrence_id
from .outcome import HISTORY_SIZE
from .overdue_edit import SLOT_FIELDS, paused_window_slot, resumed_slot
from .overlap import overlapped_calls
from .pump_options import MAX_BATCH_SIZE
from .replies import CLUSTER_NODE, is_template_field, record_text, redis_errors, replaced, text
from .scripts import Scripts
from .shown import shown
from .stamps import StampMoves
from .template_pieces import split_template
from .urls import client_from_url, is_utf8_codec
from .utf8 import check_pause_texts, is_utf8

__all__ = [
    "EVICTING_POLICIES",
    "CorruptRecords",
    "Occurrence",  # re-exported from `occurrence`, where it lives
    "Registered",
    "Registration",
    "Repeat",
    "Scan",
    "Seed",
    "Synced",
    "Upserted",
    "WakeSubscription",
    "WakeupsRefused",
    "occurrence_id",
    "redis_errors",
    "text",
]

log = logging.getLogger(__name__)

Registered = Literal["registered", "exists"]
Upserted = Literal["created", "unchanged", "updated", "owned"]
# What `upsert_declared` (a sync's upsert) answers per declaration: `Upserted`, or "restored"
# for a record left unchanged whose registry member was missing (evicted, or removed by
# hand) and is put back (upsert.lua's digit 8). `upsert` and `upsert_many` say "updated".
Synced = Literal["created", "unchanged", "updated", "owned", "restored"]
# Items per upsert script call: large enough to amortise the round trip, small enough that
# one call holds the server for a few milliseconds at most.
UPSERT_CHUNK = 500
# Registrations an upsert names at WARNING when their cadence changed while overdue; the
# rest at DEBUG, counted in one WARNING line.
OVERDUE_SHOWN = 20
# Records read per `fetch` call by a whole-registry read: one call holds the server for a
# few milliseconds at most.
FETCH_CHUNK = 2000
# Registrations read per pipeline by `list`/`iter_list`: bounded memory and server time.
READ_CHUNK = 1000
# Why a record key of another type is corrupt: it has no fields to read or flag.
_NOT_A_HASH = "the key is not a hash (WRONGTYPE)"
# 3: updated, and the old cadence's overdue slots were dropped and counted (upsert.lua).
_UPSERT_RESULTS: dict[int, Synced] = {
    0: "unchanged",
    1: "created",
    2: "updated",
    3: "updated",
    4: "owned",  # `keep_owners`: another source's record, not written
    8: "restored",  # unchanged, its missing registry member put back
    9: "restored",  # updated, and its missing registry member put back
}
# What `upsert_many` answers for each: a member put back is an update.
_API_RESULTS: dict[Synced, Upserted] = {
    "created": "created",
    "unchanged": "unchanged",
    "updated": "updated",
    "owned": "owned",
    "restored": "updated",
}
# Why a registry member is read as a corrupt registration: its record is gone.
MISSING_RECORD = (
    "its record is missing (a registry member without its record: evicted, or deleted by "
    "hand); `emq-bridge remove` drops the member"
)
# Policies that may evict keys without a TTL, i.e. the registry.
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


class CorruptRecords(CorruptRecord):
    """A bulk move (`Repeat.resume_all`) changed every registration it could, and left out
    those whose records are corrupt: `done` holds the names it changed, `corrupt` the names
    it left out."""

    def __init__(self, message: str, done: Sequence[str], corrupt: Sequence[str]) -> None:
        super().__init__(message)
        self.done = list(done)
        self.corrupt = list(corrupt)


@dataclass(frozen=True, slots=True)
class Registration:
    """A registration as stored: its definition, its next run and its counters."""

    queue: str
    name: str
    definition: Definition
    # None: none stored (completed, or its registry member is missing), or `no_run_left`.
    next_run_ms: int | None
    paused: bool
    source: str | None
    last_due_ms: int | None
    last_fired_ms: int | None
    fired: int
    missed: int
    created_ms: int | None
    updated_ms: int | None
    # Set while a permanent dispatch failure holds it paused (`Repeat.park`); resume clears it.
    parked_reason: str | None = None
    parked_ms: int | None = None
    # What the workers reported (outcome.py): the last occurrence's status and times, the
    # streak of consecutive failures, and the slots the overlap policy or a worker skipped.
    last_status: str | None = None
    last_error: str | None = None
    last_started_ms: int | None = None
    last_finished_ms: int | None = None
    last_duration_ms: int | None = None
    last_success_ms: int | None = None
    failures: int = 0
    skipped: int = 0
    lost: int = 0
    # The occurrence in flight ("<name> <due_ms>[ triggered]"), and a slot `buffer_one` keeps.
    inflight: str | None = None
    buffered_due_ms: int | None = None
    # Bounds (bounds.py): why it will never fire again (`end_at`, `limit`, `at`) and since
    # when, and the runs its `limit` has left.
    completed: Completed | None = None
    completed_ms: int | None = None
    remaining: int | None = None
    # A pause's note (why), author and instant (`Repeat.pause`); resume clears them.
    paused_note: str | None = None
    paused_by: str | None = None
    paused_ms: int | None = None
    # The backfilled slots the claim dropped unsent: the schedule could no longer have them
    # (bounds moved, a limit added, its slots placed otherwise; claim.lua).
    backfill_dropped: int = 0
    # Its record is there but its registry member is not (evicted, or removed by hand): no
    # pump claims it, so it never fires until a sync or a pause and resume puts it back.
    # Only a read that asks the registry says so (`read`, `get`, `list`).
    unscheduled: bool = False
    # Its score says it has no run left (past 9999, or every one excluded): not completed
    # (it has no bound to complete it), but nothing will fire it.
    no_run_left: bool = False

    def upcoming(self, n: int = 5, after_ms: int | None = None) -> list[int]:
        """Return the next `n` runs (epoch ms), starting with the stored next run, within
        the bounds (none past `end_at` or the last `at`, at most the `limit`'s remaining)."""
        if self.completed or self.no_run_left:
            return []
        definition = self.definition
        first = self.next_run_ms
        if first is None:
            start = after_ms if after_ms is not None else int(time.time() * 1000)
            first = definition.first_run(start, created=False)
        remaining = self.remaining if definition.bounds.limit is not None else None
        return bounded_runs(definition.cadence, definition.bounds, first, n, remaining=remaining)


# The largest run count an import carries: exact as a double (a script's number) and far
# from the counter's own limit.
MAX_CARRIED_COUNT = 2**53 - 1


@dataclass(frozen=True, slots=True)
class Seed:
    """Where a registration created by `upsert_many` starts, instead of its cadence's
    first run: an importer's (`emq_bridge.migrate`) next slot, paused state and counters
    carried over from the scheduler it replaces. Applied on creation only: an existing
    record keeps its own score, state and counters."""

    first_run_ms: int
    paused: bool = False
    fired: int = 0
    last_fired_ms: int | None = None
    # More record fields carried as they are: a moved registration's pause note, counters,
    # runs left and completion (sync.py).
    carried: Mapping[str, str] = field(default_factory=dict)
    # Where a paused one resumes from, when not `first_run_ms`: an overdue interval fires at
    # once when created (`first_run_ms` is then the import's now, and its runs go on an
    # interval after that, as its old scheduler's would), but a cut-over that resumes it
    # keeps the rhythm of the old scheduler's runs (the latest of its slots not after now).
    rhythm_ms: int | None = None

    def __post_init__(self) -> None:
        # A count the record's counter could not go on from: the next fire's increment
        # (ack.lua) would fail on it and start the count again at 1, the carried one lost.
        if type(self.fired) is not int or not 0 <= self.fired <= MAX_CARRIED_COUNT:
            raise ScheduleError(
                f"its run count {shown(self.fired)} is not a count the registry can go on "
                f"from (0 to {MAX_CARRIED_COUNT})"
            )

    @property
    def resume_ms(self) -> int:
        """The slot a paused registration of this seed is parked at (`Repeat.resume`)."""
        return self.first_run_ms if self.rhythm_ms is None else self.rhythm_ms

    def fields(self) -> dict[str, str]:
        """Return the record fields a created record gets on top of its definition's."""
        out = dict(self.carried)
        if self.fired:
            out["fired"] = str(self.fired)
        if self.last_fired_ms is not None:
            out["last_fired_ms"] = str(self.last_fired_ms)
        if self.paused:
            out.update(paused="1", paused_next_ms=str(self.resume_ms))
        return out


@dataclass(frozen=True, slots=True)
class Scan:
    """What one queue's registry holds that is due at `now_ms`."""

    now_ms: int
    due: list[tuple[str, int]]
    expired: list[str]
    earliest_ms: int | None
    earliest_lease_ms: int | None
    # Occurrences in flight whose lost deadline passed (`Repeat.mark_lost`), and the earliest
    # deadline of those still in flight (server clock): when the next may be lost.
    lost: list[str] = field(default_factory=list)
    earliest_running_ms: int | None = None
    # Members that are not valid UTF-8, by the set they are in ("due", "expired", "lost"),
    # as their bytes: planted by hand (every name is checked when written), they match no
    # record and no move by name, so the pump sets them aside (`Repeat.set_aside`).
    unreadable: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim took: candidate indexes, re-leased lease members, and what is due next.

    `replaced`: (candidate index, a member in flight it replaces) of `replace` policies, one
    pair per member (a slot replaces every run in flight, its trigger's included);
    `skipped` and `buffered`: candidate indexes the overlap policy did not fire; `dropped`:
    candidate indexes this claim moved whose missed slots it counted (the misfire policy's).
    """

    claimed: list[int]
    released: list[str]
    earliest_ms: int | None
    earliest_lease_ms: int | None
    replaced: list[tuple[int, str]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    buffered: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


# The most upcoming runs `next_runs` computes at once (the CLI's `next -n` takes up to 1000).
MAX_NEXT_RUNS = 10_000


def _page_args(offset: object, limit: object) -> None:
    """`list`'s and `names`' page: an offset from 0, a limit from 0 or None (no limit)."""
    whole_arg(offset, "offset")
    if limit is not None:
        whole_arg(limit, "limit")


def _scan_reply(reply: Any) -> Scan:
    """Decode a `scan.lua` reply: the JSON text of one array. A member that is not valid
    UTF-8 keeps its bytes (`surrogateescape`), and goes to `Scan.unreadable`: decoded with
    replacement characters, it would name nothing, and stay due for ever. So does a
    registry member that is no valid name (a space, empty: planted by hand), whose lease
    no move could read back."""
    raw = reply.decode("utf-8", "surrogateescape") if isinstance(reply, bytes) else str(reply)
    now, due, expired, first, first_lease, lost, first_running = json.loads(raw)
    pairs = [(due[i], _due_ms(due[i + 1])) for i in range(0, len(due), 2)]
    unreadable: list[tuple[str, bytes]] = []
    if not raw.isascii() and not is_utf8(raw):  # the common reply: ASCII, nothing to split
        pairs = [p for p in pairs if _readable(p[0], "due", unreadable)]
        expired = [m for m in expired if _readable(m, "expired", unreadable)]
        lost = [m for m in lost if _readable(m, "lost", unreadable)]
    if not all(is_valid_name(name) for name, _ in pairs):
        pairs = [p for p in pairs if _named(p[0], unreadable)]
    return Scan(
        int(now),
        pairs,
        expired,
        _score(first),
        _score(first_lease),
        lost,
        _score(first_running),
        unreadable,
    )


def _replaced_but_template(fields: Sequence[str], row: Any) -> Any:
    """A `fetch.lua` row (the values of `fields`) with undecodable bytes as U+FFFD, as `text`
    decodes them, but in the template's fields (`record_text`)."""
    if not isinstance(row, list):
        return row
    return [
        value if type(value) is not str or is_template_field(name) else replaced(value)
        for name, value in zip(fields, row, strict=False)
    ]


def _named(member: str, unreadable: list[tuple[str, bytes]]) -> bool:
    """True if the registry member `member` is a valid name; else note it in `unreadable`."""
    if is_valid_name(member):
        return True
    unreadable.append(("due", member.encode("utf-8", "surrogateescape")))
    return False


def _readable(member: str, where: str, unreadable: list[tuple[str, bytes]]) -> bool:
    """True if `member` is valid UTF-8; else note its bytes in `unreadable`."""
    if is_utf8(member):
        return True
    unreadable.append((where, member.encode("utf-8", "surrogateescape")))
    return False


def _call_or_error(script: Any, keys: list[str], args: list[Any], action: str) -> Any:
    """Run one script call; its `RegistryError` is returned, `RegistryUnavailable` raised."""
    try:
        with redis_errors(action):
            return script(keys=keys, args=args)
    except RegistryUnavailable:
        raise
    except RegistryError as exc:
        return exc


def _registry_error(error: Exception, action: str) -> RegistryError:
    """Return what `redis_errors` raises for `error`, a pipeline's error reply."""
    try:
        with redis_errors(action):
            raise error
    except RegistryError as mapped:  # RegistryUnavailable is one
        return mapped
    raise AssertionError("unreachable: redis_errors maps every RedisError")  # pragma: no cover


def _score(value: Any) -> int | None:
    if value is None or value in ("", b""):
        return None
    number = float(text(value))
    return None if number == float("inf") else _due_ms(number)


def _due_ms(value: Any) -> int:
    """Return a due score as integer ms, as claim.lua reads it: floored, and -inf as 0.

    Scores are integers unless edited by hand; this keeps such a member claimable.
    """
    number = float(text(value)) if not isinstance(value, float) else value
    return 0 if number == float("-inf") else math.floor(number)


def _optional_int(fields: Mapping[str, str], key: str) -> int | None:
    """The integer field `key` of a record (None when absent); a ValueError naming the field
    when it is not one (edited by hand), so a corrupt record's message says which."""
    raw = fields.get(key)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key} {raw!r} is not an integer") from None


def _int_field(raw: str | None) -> int | None:
    """A record's integer field as read, or None when absent or not one (edited by hand:
    the move that reads it goes on as if it were absent)."""
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _field_score(fields: Mapping[str, str], key: str) -> int | None:
    """`_score` of the record field `key` (`paused_next_ms`); a ValueError naming it."""
    try:
        return _score(fields.get(key))
    except ValueError:
        raise ValueError(f"{key} {fields.get(key)!r} is not a number") from None


class WakeSubscription:
    """Wake-ups from registry changes: `Repeat.subscribe` makes one, `wait` listens."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub
        self._channels = list(pubsub.channels)
        self._pid = os.getpid()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a change; True if one was published.

        In a process forked since (a Celery prefork child, a gunicorn worker) it first
        subscribes again on a connection of its own.

        Raises `RegistryUnavailable` when the connection broke (subscribe again later), and
        `WakeupsRefused` when the server refused the subscription (redis-py reads SUBSCRIBE's
        reply here, with the first message).
        """
        with _refused_wakeups(), redis_errors("wait for wake-ups"):
            self._own_connection()
            return self._pubsub.get_message(timeout=timeout_s) is not None

    def _own_connection(self) -> None:
        """Subscribe again on a new connection if this process is not the one that subscribed.

        A forked child inherits the parent's subscribed socket: two processes reading one
        stream each take the other's bytes. redis-py's pools reconnect after a fork, but a
        pub/sub holds its connection. Its reset closes only this process's copy of the socket
        (redis-py shuts a socket down only in the process that opened it): the parent keeps
        listening. The process is marked as owning it once the subscription is sent, so a
        failed one is tried again at the next wait.
        """
        if self._pid == os.getpid():
            return
        self._pubsub.reset()
        self._pubsub.subscribe(*self._channels)
        self._pid = os.getpid()

    def close(self) -> None:
        """Unsubscribe and close the connection; never raises (it may already be dead)."""
        try:
            self._pubsub.close()
        except Exception:  # closing a broken connection may itself fail; nothing to save
            log.debug("closing the wake-up subscription failed", exc_info=True)


class WakeupsRefused(RegistryError):
    """The server refused the wake-up subscription: the Redis user may not subscribe to the
    registry's channels (an ACL without `&<prefix>:*`). Asking again gets the same answer."""


@contextmanager
def _refused_wakeups() -> Iterator[None]:
    """Raise `WakeupsRefused` for a refused subscription (redis-py's NOPERM)."""
    try:
        yield
    except RegistryError as exc:
        if isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
            raise WakeupsRefused(
                "the Redis user may not subscribe to the registry's wake-up channels "
                f"({exc.__cause__})"
            ) from exc.__cause__
        raise


class StaleGeneration(RegistryError):
    """A sync of older declarations met a newer generation of its source; it wrote nothing there.

    `queue` holds generation `live` of `source`, higher than the `generation` sent.
    """

    def __init__(self, queue: str, source: str, generation: int, live: int) -> None:
        super().__init__(
            f"queue {queue!r} holds generation {live} of source {source!r}, newer than "
            f"generation {generation}: nothing of generation {generation} was written there"
        )
        self.queue, self.source, self.generation, self.live = queue, source, generation, live


# Generations are compared in Lua, whose numbers are doubles: integers up to 2**53 are exact.
MAX_GENERATION = 2**53 - 1


def generation_arg(generation: int | None, source: str | None) -> str:
    """Return the scripts' generation argument ('' for none); ConfigError if it is invalid."""
    if generation is None:
        return ""
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise ConfigError(f"generation must be an int, got {type(generation).__name__}")
    if not 0 <= generation <= MAX_GENERATION:
        raise ConfigError(f"generation must be from 0 to 2**53 - 1, got {generation}")
    if source is None:
        raise ConfigError("a generation belongs to a source: give the source too")
    return str(generation)


_ASYNC_CLIENT = (
    "Repeat needs a sync Redis client: an asyncio client (redis.asyncio) cannot be used; pass "
    "redis.Redis (or redis.cluster.RedisCluster), and call the registry from async code with "
    "asyncio.to_thread"
)


def _usable_client(client: Any) -> Any:
    """Return `client` if the moves can use it: a sync redis-py client (or one shaped like it:
    `register_script`, a sync `execute_command`) whose text encoding is UTF-8.

    Raises `ConfigError` saying what to pass: an asyncio client's moves would return
    coroutines, and a client of another encoding writes names no pump can read.
    """
    if inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
        raise ConfigError(_ASYNC_CLIENT)
    if not callable(getattr(client, "register_script", None)):
        raise ConfigError(
            f"Repeat needs a Redis client (redis.Redis or redis.cluster.RedisCluster), not "
            f"{type(client).__name__}; Repeat.from_url takes a redis:// URL"
        )
    get_encoder = getattr(client, "get_encoder", None)
    if callable(get_encoder):  # a Redis, a Sentinel's master_for, a RedisCluster
        _check_utf8(getattr(get_encoder(), "encoding", "utf-8"))
    return client


def _check_utf8(encoding: object) -> None:
    """Raise `ConfigError` unless `encoding` names UTF-8 (in any spelling)."""
    if not is_utf8_codec(str(encoding)):
        raise ConfigError(
            f"the Redis client's encoding is {encoding!r}: the registry keeps names and "
            "templates as UTF-8, and what a client of another encoding writes no pump can "
            "read; make the client with encoding='utf-8' (redis-py's default)"
        )


def clock_ms(clock: object, what: str = "a registry clock") -> int:
    """Call `clock` and return its now: epoch ms as an int from 1970 to the end of 9999.

    Anything else raises `ConfigError` naming the clock and what it returned (`what` says
    whose clock it is): a float of seconds (`time.time`) or a class (`ManualClock` rather
    than `ManualClock()`) would otherwise be written into records no move reads back.
    """
    if not callable(clock):
        raise ConfigError(
            f"{what} must be a callable returning epoch milliseconds as an int (such as a "
            f"ManualClock()), got {_clock_name(clock)}"
        )
    value = clock()
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None or isinstance(value, float | str | bool):
            got = "None" if value is None else f"{type(value).__name__} {shown(value)}"
        else:
            got = f"a {shown(value)}"  # its type's name
        hint = f": pass an instance, {clock.__name__}()" if isinstance(clock, type) else ""
        raise ConfigError(
            f"{what} must return epoch milliseconds as an int, got {got} "
            f"from {_clock_name(clock)}{hint}"
        )
    if not 0 <= value <= LATEST_MS:
        raise ConfigError(
            f"{what} must return epoch milliseconds from 0 (1970) to {LATEST_MS} (9999), got "
            f"{shown(value)} from {_clock_name(clock)}"
        )
    return value


def _clock_name(clock: object) -> str:
    """How an error names a clock: a function's or class's qualified name, else its type."""
    name = getattr(clock, "__qualname__", None)
    if isinstance(name, str):
        module = getattr(clock, "__module__", None)
        return f"{module}.{name}" if isinstance(module, str) else name
    return f"a {type(clock).__name__}"


def _per_primary(reply: Any) -> list[dict[str, Any]]:
    """A server-wide command's reply as one dict per server: a cluster's, sent to every
    primary, is a dict by node; a plain client's is the one server's dict."""
    per_node = bool(reply) and all(isinstance(v, dict) for v in reply.values())
    return list(reply.values()) if per_node else [reply]


def _call_nonce() -> str:
    """Return a nonce for one call of a move its script must not run twice (trigger):
    redis-py resends a command whose reply timed out, though the server may have run it,
    and the script answers a nonce it has seen as it did the first time."""
    return uuid.uuid4().hex


def _stale(reply: Any, queue: str, source: str | None, generation: int | None) -> None:
    """Raise `StaleGeneration` if a script's reply is its generation refusal ('!<live>')."""
    value = text(reply) if isinstance(reply, (bytes, str)) else ""
    if value.startswith("!"):
        raise StaleGeneration(queue, source or "", generation or 0, int(value[1:]))


class Repeat(LifecycleMoves, HeartbeatMoves, BackfillMoves, StampMoves):
    """The Repeat registry on one Redis (or Redis Cluster) client.

    Keys are `<prefix>:{<queue>}:repeat` (sorted set) and `<prefix>:{<queue>}:repeat:<name>`
    (hash). Times are epoch milliseconds; "now" defaults to the Redis server's clock.
    `clock` (returning epoch ms as an int; a test's `emq_bridge.testing.ManualClock`)
    replaces that clock for every "now" decided here (the moves, syncs, `server_time_ms`)
    and for a `Pump` on this registry given no clock of its own; what the Lua moves read
    of the server's own `TIME` (the deadlines of occurrences in flight) stays the server's.
    """

    def __init__(
        self, client: Any, prefix: str = DEFAULT_PREFIX, *, clock: Callable[[], int] | None = None
    ) -> None:
        self.client = _usable_client(client)  # `ConfigError` for one the moves cannot use
        self.prefix = validate_prefix(prefix)
        self.scripts = Scripts.load(client)
        self.cluster = isinstance(client, redis.cluster.RedisCluster)
        self.clock = clock
        # Whether the server is a Redis Cluster node this plain client sees part of: asked
        # once (`INFO cluster`), by the first read of the whole keyspace (`_whole_keyspace`).
        self._on_cluster_node: bool | None = None

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX, **options: Any) -> Repeat:
        """Connect to a Redis, the master a Sentinel names, or a Redis Cluster.

        `redis://`, `rediss://`, `unix://`: `redis.Redis.from_url`.
        `redis+sentinel://host:26379[,host...]/<master name>[/<db>]`: `Sentinel.master_for`,
        which follows a failover. `redis+cluster://host:6379[,host...]`: a `RedisCluster`.
        See `emq_bridge.urls` for the options.

        A malformed URL raises `ConfigError`; its message never holds the password. A
        cluster is discovered at once: `RegistryUnavailable` if no startup node answers.
        A `clock=` is the registry's, as in `Repeat(client, prefix, clock=...)`; every other
        keyword goes to the client (kept `**options` alone: a caller's `**dict` of client
        options type-checks).
        """
        clock = options.pop("clock", None)
        return cls(client_from_url(url, **options), prefix, clock=clock)

    def keys(self, queue: str) -> QueueKeys:
        return QueueKeys(self.prefix, validate_name(queue, "queue"))

    # -- the connection -------------------------------------------------------------------

    def close(self) -> None:
        """Close the client's connections; a later move opens new ones."""
        self.client.close()

    def __enter__(self) -> Repeat:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def subscribe(self, queues: Sequence[str]) -> WakeSubscription:
        """Subscribe to the registry changes of `queues` (each move publishes on its queue).

        Raises `RegistryUnavailable`/`RegistryError` when the subscription cannot be made.
        """
        channels = [self.keys(q).wake_channel for q in queues]
        with _refused_wakeups(), redis_errors("SUBSCRIBE"):
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(*channels)
            except BaseException:
                pubsub.close()
                raise
        return WakeSubscription(pubsub)

    def check_eviction_policy(self, known: str | None = None) -> str | None:
        """Warn loudly if Redis may evict registry keys; return the policy if it could be read.

        On a cluster every primary holds registries, so each is asked. No warning when the
        policy is `known` (what an earlier check returned), so a periodic check warns once
        per change.
        """
        policy = self.eviction_policy()
        if policy in EVICTING_POLICIES and policy != known:
            log.warning(
                "maxmemory-policy is %s: Redis may evict registry keys and lose schedules; "
                "set it to noeviction (or a volatile-* policy)",
                policy,
            )
        return policy

    def eviction_policy(self) -> str | None:
        """Return the server's `maxmemory-policy` (on a cluster, an evicting one of any
        primary's, else the first's), or None when it cannot be read (said at INFO).

        Read with `CONFIG GET`; where CONFIG is refused (an ACL) or renamed away (a managed
        service: ElastiCache, MemoryDB), from `INFO memory` instead, one more round trip.
        """
        try:
            policies = self._configured_policies()
        except RegistryUnavailable as exc:
            log.info("could not read maxmemory-policy (%s); make sure it is noeviction", exc)
            return None
        except RegistryError as refused:
            try:
                policies = self._reported_policies()
            except RegistryError as exc:  # INFO is @dangerous too, to an ACL
                log.info(
                    "could not read maxmemory-policy (%s; %s); make sure it is noeviction",
                    refused,
                    exc,
                )
                return None
        return next((p for p in policies if p in EVICTING_POLICIES), policies[0])

    def _primaries(self) -> dict[str, Any]:
        """The options that send a server-wide command to every primary of a cluster."""
        return {"target_nodes": self.client.PRIMARIES} if self.cluster else {}

    def _configured_policies(self) -> builtins.list[str]:
        """Return each primary's `maxmemory-policy` as `CONFIG GET` answers it (at least one)."""
        with redis_errors("CONFIG GET maxmemory-policy"):
            reply = self.client.config_get("maxmemory-policy", **self._primaries())
        return [str(next(iter(node.values()), "")) if node else "" for node in _per_primary(reply)]

    def _memory_info(self) -> builtins.list[dict[str, Any]]:
        """Each primary's `INFO memory` (at least one). Raises `RegistryError`."""
        with redis_errors("INFO memory"):
            return _per_primary(self.client.info("memory", **self._primaries()))

    def _reported_policies(self) -> builtins.list[str]:
        """Return each primary's `maxmemory_policy` as `INFO memory` reports it (at least
        one); `RegistryError` if a server's INFO does not name it."""
        nodes = self._memory_info()
        if not all("maxmemory_policy" in node for node in nodes):
            raise RegistryError("INFO memory: the server does not report its maxmemory_policy")
        return [text(node["maxmemory_policy"]) for node in nodes]

    def out_of_memory(self) -> bool | None:
        """Whether the server (on a cluster, any primary) has used its `maxmemory`, so that it
        refuses writes that may grow memory: a pump's heartbeat and moves, the workers'
        reports. One `INFO memory`; None when it cannot be read (an ACL refusing INFO)."""
        try:
            nodes = self._memory_info()
        except RegistryError:
            return None
        try:
            return any(
                0 < int(node.get("maxmemory", 0)) <= int(node.get("used_memory", 0))
                for node in nodes
            )
        except (TypeError, ValueError):
            return None

    def any_exist(self, groups: Sequence[Sequence[str]], what: str) -> builtins.list[bool]:
        """Return, for each group of keys, whether any of them exists: one pipeline of one
        `EXISTS` per group (the keys of a group share a slot: one queue's, or one key).
        Raises `RegistryUnavailable`/`RegistryError` (`what` names the read)."""
        if not groups:
            return []
        with redis_errors(what):
            pipe = self.client.pipeline(transaction=False)
            for keys in groups:
                pipe.exists(*keys)
            replies = pipe.execute()
        return [bool(int(found)) for found in replies]

    def server_time_ms(self) -> int:
        """Return the Redis server's clock in epoch ms (the one clock pumps agree on), or the
        registry's `clock` when it has one (a test's): `ConfigError` if that clock returns
        anything but an int of epoch ms (a float of seconds, `time.time`)."""
        if self.clock is not None:
            return clock_ms(self.clock)
        with redis_errors("TIME"):
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def server_identity(self) -> str | None:
        """Return what tells this registry's server from one restarted since: its `run_id`
        (`INFO server`; on a cluster, its primaries' run_ids joined, so a failover reads as
        another server too). None when the server does not say (an ACL without INFO, a
        fake server). Raises `RegistryUnavailable` when it cannot be reached."""
        # A cluster client asks one node by default: every primary holds part of a sync.
        targets = {"target_nodes": redis.cluster.RedisCluster.PRIMARIES} if self.cluster else {}
        try:
            with redis_errors("INFO server"):
                info = self.client.info("server", **targets)
        except RegistryUnavailable:
            raise
        except RegistryError:
            return None
        if not isinstance(info, dict):
            return None
        if "run_id" in info:
            return text(info["run_id"])
        nodes = [node for node in info.values() if isinstance(node, dict) and "run_id" in node]
        return " ".join(sorted(text(node["run_id"]) for node in nodes)) or None

    def _now(self, now_ms: int | None) -> int:
        now = now_arg(now_ms)
        return self.server_time_ms() if now is None else now

    def _scan_now(self, now_ms: int | None) -> int | str:
        """A scan's now: `now_ms`, else the registry's `clock`, else '' (the script reads the
        server's `TIME`: no round trip more)."""
        now = now_arg(now_ms)
        if now is not None:
            return now
        return "" if self.clock is None else clock_ms(self.clock)

    # -- registration moves -------------------------------------------------------------

    def register(
        self,
        queue: str,
        name: str,
        *,
        every: float | timedelta | str | None = None,
        every_ms: int | None = None,
        cron: str | None = None,
        tz: str | None = None,
        anchor: Anchor = "grid",
        misfire: Misfire = "coalesce",
        template: Mapping[str, Any] | None = None,
        overlap: Overlap = "allow",
        pause_after_failures: int | None = None,
        catchup_window: float | timedelta | str | None = None,
        catchup_max: int | None = None,
        offset: Offset | None = None,
        at: Instant | Sequence[Instant] | None = None,
        start_at: Instant | None = None,
        end_at: Instant | None = None,
        limit: int | None = None,
        immediately: bool = False,
        labels: Mapping[str, str] | None = None,
        definition: Definition | None = None,
        now_ms: int | None = None,
    ) -> Registered:
        """Register `name` once: `registered`, or `exists` when it is already there.

        `exists` writes nothing, so the live cadence is never disturbed by a re-register.
        `offset`, `at`, `start_at`, `end_at`, `limit` and `immediately` are `define`'s
        (emq_bridge.bounds); a registration with no slot left is written `completed`.
        `labels` (str -> str) tag it (emq_bridge.labels). `definition` (a `define(...)`)
        replaces the others: given with any of them it raises `ScheduleError`.
        """
        keys = self.keys(queue)
        validate_name(name, "registration name")
        definition = definition_or_define(  # refuses definition= with any of the others
            definition,
            every=every,
            every_ms=every_ms,
            cron=cron,
            tz=tz,
            anchor=anchor,
            misfire=misfire,
            template=template,
            overlap=overlap,
            pause_after_failures=pause_after_failures,
            catchup_window=catchup_window,
            catchup_max=catchup_max,
            offset=offset,
            at=at,
            start_at=start_at,
            end_at=end_at,
            limit=limit,
            immediately=immediately,
            labels=labels,
        )
        definition = definition.for_name(name)  # the seed of a cron's H and of jitter
        now = self._now(now_ms)
        fields = self._record_fields(definition, now, source=None)
        with redis_errors(f"register {queue}/{name}"):
            created = self.scripts.register(
                keys=[keys.registry, keys.record(name), keys.synced],
                args=[
                    name,
                    definition.first_run(now),
                    keys.wake_channel,
                    *_flatten(fields),
                ],
            )
        return "registered" if int(created) == 1 else "exists"

    def upsert(
        self,
        queue: str,
        name: str,
        *,
        every: float | timedelta | str | None = None,
        every_ms: int | None = None,
        cron: str | None = None,
        tz: str | None = None,
        anchor: Anchor = "grid",
        misfire: Misfire = "coalesce",
        template: Mapping[str, Any] | None = None,
        overlap: Overlap = "allow",
        pause_after_failures: int | None = None,
        catchup_window: float | timedelta | str | None = None,
        catchup_max: int | None = None,
        offset: Offset | None = None,
        at: Instant | Sequence[Instant] | None = None,
        start_at: Instant | None = None,
        end_at: Instant | None = None,
        limit: int | None = None,
        immediately: bool = False,
        labels: Mapping[str, str] | None = None,
        definition: Definition | None = None,
        source: str | None = None,
        now_ms: int | None = None,
    ) -> Upserted:
        """Create `name`, leave it alone if its definition is unchanged, or rewrite it.

        `unchanged` writes nothing. `updated` keeps the next run unless the cadence changed,
        in which case the next run is re-derived from now under the new cadence.
        `source` tags the owner of the registration (used by `sync` to prune). `definition`
        (a `define(...)`) replaces the cadence and policy arguments: given with any of them it
        raises `ScheduleError`.
        """
        definition = definition_or_define(  # refuses definition= with any of the others
            definition,
            every=every,
            every_ms=every_ms,
            cron=cron,
            tz=tz,
            anchor=anchor,
            misfire=misfire,
            template=template,
            overlap=overlap,
            pause_after_failures=pause_after_failures,
            catchup_window=catchup_window,
            catchup_max=catchup_max,
            offset=offset,
            at=at,
            start_at=start_at,
            end_at=end_at,
            limit=limit,
            immediately=immediately,
            labels=labels,
        )
        return self.upsert_many([(queue, name, definition)], source=source, now_ms=now_ms)[0]

    def upsert_many(
        self,
        items: Sequence[tuple[str, str, Definition]],
        *,
        source: str | None = None,
        now_ms: int | None = None,
        generation: int | None = None,
        queues: Sequence[str] = (),
        seeds: Sequence[Seed | None] = (),
        keep_owners: bool = False,
    ) -> list[Upserted]:
        """Upsert `(queue, name, definition)` items; return one result per item, in order.

        `keep_owners=True` never takes over a record owned by another source (or by none):
        such an item is not written and its result is "owned" (an import's rule, decided in
        the script with the write).

        `seeds`, when given, holds one `Seed` (or None) per item: what a record created by
        this call starts from (an importer's next slot, state and counters, see `Seed`).

        Items are sent per queue in chunks of `UPSERT_CHUNK`, each chunk one atomic script.
        A failure midway leaves earlier chunks applied; running the same call again converges.

        With `generation` (an int the deploy raises; it needs `source`), each chunk first
        reads the queue's stored generation of `source`: if it is higher the chunk writes
        nothing and `StaleGeneration` is raised (earlier chunks stay applied); otherwise the
        stored generation is raised to `generation` in the same script as the chunk's writes.
        `queues` adds queues to check and raise without items (what `sync` does first, so
        that what it reads next can no longer be changed by an older generation).
        """
        for item in items:
            sequence = isinstance(item, tuple | list)
            if not (sequence and len(item) == 3 and isinstance(item[2], Definition)):
                raise ScheduleError(
                    "upsert_many takes (queue, name, Definition) tuples, got "
                    f"{type(item).__name__}" + (f" of {len(item)}" if sequence else "")
                )
            validate_name(item[0], "queue")
            validate_name(item[1], "registration name")
        results = self._upsert(
            items, source, now_ms, generation, queues, seeds, declared=False, keep=keep_owners
        )
        # A member put back is an update to the API's callers (as before digit 8 existed).
        return [_API_RESULTS[r] for r in results]

    def upsert_declared(
        self,
        declarations: Sequence[Declaration],
        *,
        source: str | None = None,
        generation: int | None = None,
        queues: Sequence[str] = (),
        seeds: Sequence[Seed | None] = (),
    ) -> list[Synced]:
        """Upsert declarations as `upsert_many` does their `(queue, name, definition)`.

        A `Declaration` checked its names and seeded its definition with its name when it
        was built, so a sync of many does neither again. `seeds` as `upsert_many`'s.
        "restored" for an unchanged record whose registry member was missing (evicted, or
        removed by hand): the script put it back, at its next run under its cadence (at
        +inf when paused or completed), where `upsert_many` says "updated".
        """
        items = [(d.queue, d.name, d.definition) for d in declarations]
        return self._upsert(items, source, None, generation, queues, seeds, declared=True)

    def _upsert(
        self,
        items: Sequence[tuple[str, str, Definition]],
        source: str | None,
        now_ms: int | None,
        generation: int | None,
        queues: Sequence[str],
        seeds: Sequence[Seed | None],
        *,
        declared: bool,
        keep: bool = False,
    ) -> list[Synced]:
        """`upsert_many` of items whose names are valid (`declared`: and whose definitions
        are seeded with them)."""
        if source is not None:
            validate_name(source, "source")
        gen = generation_arg(generation, source)
        by_queue: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            by_queue.setdefault(item[0], []).append(index)
        now = self._now(now_ms)
        _check_runs_left(items, now, declared)
        results: list[Synced | None] = [None] * len(items)
        chunks = [
            (queue, indexes[start : start + UPSERT_CHUNK])
            for queue, indexes in by_queue.items()
            for start in range(0, len(indexes), UPSERT_CHUNK)
        ]
        chunks += [
            (validate_name(q, "queue"), []) for q in dict.fromkeys(queues) if q not in by_queue
        ]
        # A name given twice (the last wins) may fall in two chunks: those then run in order,
        # never overlapped, which could apply a chunk sent again after a later one.
        in_order = len({(item[0], item[1]) for item in items}) < len(items)

        # Per item sent again (digit 5): the slot its old, jittered cadence had not sent yet.
        old_slots: dict[int, int] = {}
        # Per item sent again (digit 6): the cadence digest and score read, and the slot it
        # resumes at ('' for none: its overdue slots are dropped).
        resumes: dict[int, list[str]] = {}

        def calls(
            chunks: builtins.list[tuple[str, builtins.list[int]]], pending: bool = False
        ) -> Iterator[tuple[builtins.list[str], builtins.list[Any]]]:
            for queue, chunk in chunks:
                keys = self.keys(queue)
                shared: dict[Any, _Shared] = {}
                payload = [
                    self._upsert_item(
                        items[i][1],
                        items[i][2] if declared else items[i][2].for_name(items[i][1]),
                        source,
                        now,
                        seeds[i] if seeds else None,
                        shared,
                        pending,
                        old_slots.get(i),
                        resumes.get(i),
                    )
                    for i in chunk
                ]
                shapes = _share_stale(payload)
                yield (
                    [
                        keys.registry,
                        keys.generations,
                        keys.synced,
                        *(keys.record(items[i][1]) for i in chunk),
                    ],
                    [
                        keys.wake_channel,
                        now,
                        _PAYLOAD.encode(payload),
                        source or "",
                        gen,
                        _PAYLOAD.encode(shapes),
                        "1" if keep else "",
                    ],
                )

        # Chunk k+1 is encoded while the server applies chunk k (see `overlap`).
        with redis_errors(f"upsert {', '.join(dict.fromkeys(q for q, _ in chunks))}"):
            replies = overlapped_calls(
                self.client, self.scripts.upsert, calls(chunks), in_order=in_order
            )
            again: dict[str, builtins.list[int]] = {}
            overdue = 0
            not_hashes: builtins.list[str] = []

            def tally(queue: str, i: int, digit: str) -> None:
                nonlocal overdue
                if digit == "7":  # a record key of another type: left as it is
                    not_hashes.append(f"{queue}/{items[i][1]}")
                    return
                results[i] = _UPSERT_RESULTS[int(digit)]
                if digit == "3":
                    overdue += 1
                    # A deploy may change thousands while no pump runs: a few are named.
                    log.log(
                        logging.WARNING if overdue <= OVERDUE_SHOWN else logging.DEBUG,
                        "%s/%s: its cadence changed while its next run was overdue (no pump "
                        "had claimed it yet: none running, or its next tick a moment away); "
                        "the old cadence's passed slots are dropped, counted in missed",
                        queue,
                        items[i][1],
                    )

            for (queue, chunk), reply in zip(chunks, replies, strict=True):
                _stale(reply, queue, source, generation)
                for i, digit in zip(chunk, text(reply), strict=True):
                    if digit in "56":  # written by the second call, with what it asks for
                        again.setdefault(queue, []).append(i)
                        if digit == "6":
                            resumes[i] = []
                        continue
                    tally(queue, i, digit)
            if again:
                # The records whose old cadence jittered and whose next run was still ahead
                # (5), sent again with the slot their new cadence may have to fire at once;
                # and those whose next run is overdue (6), with the slot they resume at.
                retried = [(queue, indexes) for queue, indexes in again.items()]
                for queue, indexes in retried:
                    jittered = [i for i in indexes if i not in resumes]
                    if jittered:
                        old_slots.update(self._unsent_slots(queue, jittered, items))
                    overdue_edits = [i for i in indexes if i in resumes]
                    if overdue_edits:
                        resumes.update(self._resume_slots(queue, overdue_edits, items, declared))
                replies = overlapped_calls(
                    self.client, self.scripts.upsert, calls(retried, True), in_order=in_order
                )
                for (queue, chunk), reply in zip(retried, replies, strict=True):
                    _stale(reply, queue, source, generation)
                    for i, digit in zip(chunk, text(reply), strict=True):
                        tally(queue, i, digit)
            if overdue > OVERDUE_SHOWN:
                log.warning(
                    "%d more cadence(s) changed while their next run was overdue; their old "
                    "cadence's passed slots are dropped, counted in missed (listed at DEBUG)",
                    overdue - OVERDUE_SHOWN,
                )
        if not_hashes:
            raise _not_hashes_error(not_hashes, len(items))
        return [r for r in results if r is not None]

    def _upsert_item(
        self,
        name: str,
        definition: Definition,
        source: str | None,
        now: int,
        seed: Seed | None,
        shared: dict[Any, _Shared],
        pending: bool = False,
        old_slot: int | None = None,
        resume: list[str] | None = None,
    ) -> list[Any]:
        """Return one item of `upsert.lua`'s ARGV[3], for a `definition` seeded with `name`
        (`Definition.for_name`: the seed of a cron's H and of jitter). `shared` holds, per
        shape of the call's definitions (`shape_key`), what the items of that shape share.
        `pending`: with the last slot of the cadence at or before `now` and the instant it is
        sent at (`pending_slot`), for the record upsert.lua asked it of (result digit 5),
        and `old_slot`, the nominal slot of the record's live score under its old cadence."""
        # The stamps, digests and owner are not among the fields: upsert.lua writes them from
        # the item's digests and the call's `now` and source, so each JSON item the server
        # decodes is that much shorter.
        template = split_template(definition.template_json)
        key = shape_key(definition) if seed is None else None
        try:
            common = shared.get((key, len(template))) if key is not None else None
        except TypeError:  # an unhashable part (a time zone given as an object)
            key, common = None, None
        if common is None:
            common = self._shared_fields(definition, source, now, seed, template)
            if key is not None:
                shared[(key, len(template))] = common
        flat, stale, first_run, created_run = common
        item = [
            name,
            record_digest(definition, source),
            definition.cadence_digest,
            first_run,
            [*flat, *_flatten(template)],
            stale,
            [] if seed is None else _flatten(seed.fields()),
        ]
        if created_run is not None or pending:
            item.append(created_run or first_run)
        if resume is not None:  # no pending slot (its next run was overdue, not ahead)
            item += [["", "", ""], resume]
        elif pending:
            slot = pending_slot(definition.cadence, now)
            start = definition.bounds.start_ms
            if slot is not None and start is not None and slot[0] < start:
                slot = None  # before its start: no slot of it, pending or not
            sent = ["", ""] if slot is None else [str(slot[0]), str(slot[1])]
            item.append([*sent, "" if old_slot is None else str(old_slot)])
        return item

    def _unsent_slots(
        self, queue: str, indexes: Sequence[int], items: Sequence[tuple[str, str, Definition]]
    ) -> dict[int, int]:
        """The nominal slot of each record's live score under its stored (old, jittered)
        cadence, by item index: the slot it had not sent yet, which upsert.lua counts missed
        if the new cadence does not fire it (one read, on the rare path of digit 5)."""
        found = self.get_many(queue, [items[i][1] for i in indexes])
        out: dict[int, int] = {}
        for i in indexes:
            registration = found.get(items[i][1])
            if registration is not None and registration.next_run_ms is not None:
                definition = registration.definition
                bounds = definition.bounds
                immediate = (
                    immediate_at(registration.created_ms, bounds.start_ms)
                    if bounds.immediately
                    else None
                )
                out[i] = nominal_slot(definition.cadence, registration.next_run_ms, immediate)
        return out

    def _resume_slots(
        self,
        queue: str,
        indexes: Sequence[int],
        items: Sequence[tuple[str, str, Definition]],
        declared: bool,
    ) -> dict[int, list[str]]:
        """For each record upsert.lua answered digit 6 (its cadence digest changes while its
        next run is overdue), by item index: its cadence digest and score as read now, and
        the slot the new definition resumes it at, or '' (`overdue_edit.resumed_slot`). One
        read, on the rare path of an edit while no pump runs."""
        keys = self.keys(queue)
        read = ["cadence_digest", "paused", "paused_next_ms", "last_due_ms", *SLOT_FIELDS]
        pipe = self.client.pipeline(transaction=False)
        for i in indexes:
            pipe.hmget(keys.record(items[i][1]), read)
            pipe.zscore(keys.registry, items[i][1])
        replies = pipe.execute()
        out: dict[int, list[str]] = {}
        for n, i in enumerate(indexes):
            fields, score = replies[2 * n], replies[2 * n + 1]
            name, definition = items[i][1], items[i][2]
            if not declared:
                definition = definition.for_name(name)
            stored = [None if v is None else text(v) for v in fields]
            if stored[1] == "1":  # paused: the parked slot stands for the score
                placed = stored[2] or ""
                slot = paused_window_slot(definition, _int_field(placed), _int_field(stored[3]))
            else:
                live = None if score is None or not math.isfinite(score) else int(score)
                placed = "" if live is None else str(live)
                slot = resumed_slot(definition, stored[4:], live)
            out[i] = [stored[0] or "", placed, "" if slot is None else str(slot)]
        return out

    @staticmethod
    def _shared_fields(
        definition: Definition,
        source: str | None,
        now: int,
        seed: Seed | None,
        template: dict[str, str],
    ) -> _Shared:
        """What an upsert item of `definition` holds besides its template's fields, its name
        and digests: equal for the definitions of one shape (`shape_key`)."""
        fields = definition.to_fields()
        fields.update(template)
        flat = [
            part
            for field, value in fields.items()
            if field not in template
            for part in (field, value)
        ]
        # An update keeps the cadence's grid and does not fire `immediately` again. A seed
        # starts a created registration (upsert.lua's item 8); an existing one goes on from
        # its own runs, as any update (an importer's stale last run would re-seed it).
        first_run = definition.first_run(now, created=False)
        created_run = None
        if seed is not None:
            created_run = str(seed.first_run_ms)
        elif definition.bounds.immediately:  # else created the same way
            run = definition.first_run(now)
            if run != first_run:
                created_run = str(run)
        return flat, _stale_fields(fields, source), str(first_run), created_run

    def _record_fields(
        self, definition: Definition, now_ms: int, source: str | None
    ) -> dict[str, str]:
        fields = _definition_fields(definition)
        fields["digest"] = record_digest(definition, source)
        fields["cadence_digest"] = definition.cadence_digest
        fields["created_ms"] = str(now_ms)
        fields["updated_ms"] = str(now_ms)
        if source is not None:
            fields["source"] = source
        return fields

    def cancel(
        self,
        queue: str,
        name: str,
        *,
        if_source: str | None = None,
        generation: int | None = None,
    ) -> bool:
        """Remove `name`, its registry member, leases, occurrences in flight and history;
        True if anything existed.

        With `if_source`, remove it only if the record is owned by that source. With
        `generation` too (a sync's prune), remove nothing and raise `StaleGeneration` when the
        queue holds a higher generation of that source; else raise the stored one to it.
        """
        keys = self.keys(queue)
        validate_name(name, "registration name")
        gen = generation_arg(generation, if_source)
        with redis_errors(f"cancel {queue}/{name}"):
            removed = self.scripts.cancel(
                keys=[
                    keys.registry,
                    keys.record(name),
                    keys.leases,
                    keys.generations,
                    keys.running,
                    keys.history(name),
                    keys.backfilled(name),
                    keys.synced,
                ],
                args=[name, if_source or "", gen],
            )
        _stale(removed, queue, if_source, generation)
        return int(removed) == 1

    def generations(self, queue: str) -> dict[str, int]:
        """Return `{source: highest generation synced}` for `queue` (sources that sent one)."""
        keys = self.keys(queue)
        with redis_errors(f"generations {queue}"):
            stored = self.client.hgetall(keys.generations)
        return {text(k): int(text(v)) for k, v in stored.items()}

    def pause(
        self,
        queue: str,
        name: str,
        *,
        note: str | None = None,
        by: str | None = None,
        now_ms: int | None = None,
    ) -> bool:
        """Stop firing `name` until resumed; True if it was running. `UnknownRegistration` (a
        `KeyError`) if unknown.

        `note` (why) and `by` (who) are kept in the record with the instant, shown by `show`
        and cleared by `resume`; pausing a paused registration changes nothing.
        """
        check_pause_texts(note, by)  # invalid UTF-8: ScheduleError, not a failed encoding
        keys = self.keys(queue)
        validate_name(name, "registration name")
        note, by = _pause_text(note, "note"), _pause_text(by, "by")
        now = self._now(now_ms)
        with redis_errors(f"pause {queue}/{name}"):
            result = int(
                self.scripts.pause(
                    keys=[keys.registry, keys.record(name)],
                    args=[name, keys.wake_channel, note, by, now],
                )
            )
        if result < 0:
            raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
        return result == 1

    # Reads of a resume whose record changed before its write (resume.lua's conflict).
    _RESUME_ATTEMPTS = 5

    def resume(
        self,
        queue: str,
        name: str,
        *,
        catchup: bool = False,
        now_ms: int | None = None,
        seed: Seed | None = None,
    ) -> bool:
        """Fire `name` again from its next slot in the future; True if it was paused.

        An interval keeps its phase; slots that passed while paused are not fired (nor
        counted: a pause is on purpose), and neither is any slot at or before the last one
        fired. With `catchup=True` the slots that passed while paused are handed to the
        registration's misfire policy instead: its next run is the first of them, and the
        next claim fires and drops them as after an outage (`latest` fires the newest).
        The next run is computed here (cron math is Python's) from the record as read;
        `resume.lua` writes it only if the record is still as read, else it is read again.
        `UnknownRegistration` (a `KeyError`) if there is no such registration, `CorruptRecord`
        if its record cannot be read (nothing written); `RegistryError` if the record kept
        changing for every attempt.

        `seed` (an importer's cut-over, `emq_bridge.migrate`) resumes it where the scheduler
        it replaces would fire next, `seed.resume_ms`, instead of the slot it was paused
        at (that scheduler kept running it meanwhile, from its own last runs), with that
        scheduler's run count and last run. A slot of it already passed is not fired: that
        scheduler may have sent it without its store saying so yet (django-celery-beat saves
        its last runs every few minutes); it is counted in `missed`, with one WARNING. With
        `catchup` (one that stores a run before it sends it: celery-redbeat) the passed
        slots go to the misfire policy instead, as for any resume with `catchup`.
        """
        return self._resume(queue, name, catchup, now_ms, seed, None)

    def resume_parked(
        self,
        queue: str,
        name: str,
        *,
        code: tuple[str, int | None] | None = None,
        now_ms: int | None = None,
    ) -> bool:
        """Resume `name` as `resume` does, but only if a pump parked it for a dispatch that
        could not work (an actor or task its process did not know: `park.lua`), a pump that
        ran other code than `code` (the (source, generation) of the caller's declarations,
        when it has a generation), and nothing else paused it (a pause by hand, a failure
        streak's); True if it was resumed. A sync of code that declares it calls it: that
        code may send what the parking one could not (a rollback's pump parked the newer
        version's schedules). Decided in `resume.lua`, from the record as it stands."""
        source, generation = code if code is not None else ("", None)
        condition = "dispatch" if generation is None else f"dispatch {source} {generation}"
        return self._resume(queue, name, False, now_ms, None, None, condition=condition)

    def _resume(
        self,
        queue: str,
        name: str,
        catchup: bool,
        now_ms: int | None,
        seed: Seed | None,
        told: builtins.list[tuple[str, int]] | None,
        *,
        condition: str = "",
    ) -> bool:
        """`resume`; the slots dropped at the resume are added to `told` instead of logged
        when it is given. `condition`: resume.lua's ARGV[9] (`resume_parked`)."""
        if not isinstance(catchup, bool):  # "no" would be taken as True
            raise ScheduleError(f"catchup must be True or False, got {type(catchup).__name__}")
        now_arg(now_ms)
        keys = self.keys(queue)
        for _ in range(self._RESUME_ATTEMPTS):
            read = self._read_parked(queue, name)
            if read is None:
                raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
            registration, as_read = read
            if not registration.paused:
                return False
            now = self._now(now_ms)
            parked = registration.next_run_ms  # a paused registration's parked next run
            if registration.no_run_left:
                parked = NEVER_MS  # parked past 9999 (or every run excluded): it stays so
            if seed is not None:
                parked = seed.resume_ms
            cadence = registration.definition.cadence
            if parked is None:
                next_ms = registration.definition.first_run(now, created=False)
            elif parked > now or catchup:  # catchup: the claim's misfire policy decides
                next_ms = parked
            else:
                next_ms, _ = advance(cadence, parked, now, "coalesce")
            if catchup:
                dropped = 0
            elif seed is not None:
                dropped = _missed_at_cut_over(registration, parked, now)
            else:
                dropped = _missed_before_pause(registration, now)
            last = registration.last_due_ms
            if last is not None and next_ms <= last:
                # Parked at or before the last fired slot: resume after it instead.
                if catchup:
                    next_ms = cadence.next_after(last)
                else:
                    next_ms, _ = advance(cadence, last, max(now, last), "coalesce")
            with redis_errors(f"resume {queue}/{name}"):
                result = int(
                    self.scripts.resume(
                        keys=[keys.registry, keys.record(name)],
                        args=[
                            *(name, min(next_ms, NEVER_MS), keys.wake_channel, *as_read, now),
                            dropped,
                            condition,
                            *_flatten(_counters(seed)),
                        ],
                    )
                )
            if result == -1:
                raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
            if result != -2:  # -2: the record changed since it was read
                if result == 1 and dropped and told is not None:
                    told.append((name, dropped))  # resume_all says them in a few lines
                elif result == 1 and dropped and seed is not None:
                    log.warning(
                        "%s/%s: %d slot(s) passed since the scheduler it replaces last ran it; "
                        "not fired at the cut-over (that scheduler may have sent them), counted "
                        "in missed",
                        queue,
                        name,
                        dropped,
                    )
                elif result == 1 and dropped:
                    log.warning(
                        "%s/%s: %d slot(s) passed before it was paused and no pump sent them "
                        "(none ran, or its next tick was a moment away); dropped at its "
                        "resume, counted in missed (resume with catch-up hands them to the "
                        "misfire policy)",
                        queue,
                        name,
                        dropped,
                    )
                return result == 1
        raise RegistryError(
            f"resume {queue}/{name}: the registration changed under each of "
            f"{self._RESUME_ATTEMPTS} attempts; try again"
        )

    def pause_all(
        self,
        queue: str,
        *,
        source: str | None = None,
        note: str | None = None,
        by: str | None = None,
        now_ms: int | None = None,
    ) -> builtins.list[str]:
        """Pause every registration of `queue` (only those `source` owns, if given); return
        the names this call paused, in next-run order. Each pause is its own atomic move.

        A registration whose record is corrupt (edited by hand) is paused too, as `pause`
        pauses it (the flag needs no decoding, and a record corrupt in a field the pump does
        not read still fires): chosen by its raw fields, and logged, since `resume` refuses
        it until it is removed and added again. A record key that is not a hash has no flag
        to set: it is left out, and logged."""
        if source is not None:
            validate_name(source, "source")
        note, by = _pause_text(note, "note"), _pause_text(by, "by")
        names: builtins.list[str] = []
        corrupt: dict[str, str] = {}
        for registration, name, fields, error in self.iter_checked(queue):
            if error in (_NOT_A_HASH, MISSING_RECORD):
                _leave_alone(queue, name, "paused", error)
                continue
            paused = fields.get("paused") == "1"  # as pause.lua reads it
            owner = registration.source if registration is not None else fields.get("source")
            if not paused and (source is None or (owner or None) == source):
                names.append(name)
                if registration is None:
                    corrupt[name] = error
        done = [n for n in names if self._pause_known(queue, n, note, by, now_ms)]
        for name in done:
            if name in corrupt:
                log.warning(
                    "paused %s/%s, whose record is corrupt: %s; resume refuses it until it is "
                    "removed and added again",
                    queue,
                    name,
                    corrupt[name],
                )
        return done

    def resume_all(
        self,
        queue: str,
        *,
        source: str | None = None,
        catchup: bool = False,
        now_ms: int | None = None,
    ) -> builtins.list[str]:
        """Resume every paused registration of `queue` (only those `source` owns, if given),
        as `resume` does; return the names resumed. A parked one (a dispatch that can never
        work, or a failure streak) stays parked: resume it by name once its cause is fixed.

        A paused one whose record is corrupt (edited by hand) is left as it is; the others
        are resumed, then `CorruptRecords` names those left out (and those resumed). A
        record key that is not a hash (never paused by a move) is left out, and logged."""
        if source is not None:
            validate_name(source, "source")
        names: builtins.list[str] = []
        corrupt: dict[str, str] = {}
        for registration, name, fields, error in self.iter_checked(queue):
            if error in (_NOT_A_HASH, MISSING_RECORD):
                _leave_alone(queue, name, "resumed", error)
                continue
            if registration is not None:
                paused, parked, owner = (
                    registration.paused,
                    registration.parked_reason,
                    registration.source,
                )
            else:  # as its raw fields say: whether this resume would have taken it
                paused, parked = fields.get("paused") == "1", fields.get("parked_reason") or None
                owner = fields.get("source") or None
            if paused and parked is None and (source is None or owner == source):
                if registration is None:
                    corrupt[name] = error
                else:
                    names.append(name)
        resumed = []
        told: builtins.list[tuple[str, int]] = []
        for name in names:
            try:
                if self._resume(queue, name, catchup, now_ms, None, told):
                    resumed.append(name)
            except KeyError:  # removed since it was listed
                continue
            except CorruptRecord as exc:  # edited by hand since it was listed
                corrupt[name] = str(exc.__cause__ or exc)
        _log_dropped_at_resume(queue, told)
        if corrupt:
            left_out = "; ".join(f"{n}: {why}" for n, why in corrupt.items())
            raise CorruptRecords(
                f"resume {queue}: {len(corrupt)} paused registration(s) left paused, their "
                f"records are corrupt ({left_out}); {len(resumed)} resumed",
                resumed,
                builtins.list(corrupt),
            )
        return resumed

    def _pause_known(
        self, queue: str, name: str, note: str | None, by: str | None, now_ms: int | None
    ) -> bool:
        try:
            return self.pause(queue, name, note=note, by=by, now_ms=now_ms)
        except KeyError:  # removed since it was listed
            return False

    def _read_parked(self, queue: str, name: str) -> tuple[Registration, list[str]] | None:
        """Read `name` for a resume in one HGETALL: the registration (None if missing) and
        the fields resume.lua checks are unchanged, as read ('' when absent).
        `CorruptRecord` if the record cannot be read."""
        validate_name(name, "registration name")
        with redis_errors(f"read {queue}/{name}"):
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(self.keys(queue).record(name))
            (raw,) = pipe.execute(raise_on_error=False)
            if isinstance(raw, Exception) and not _wrong_type(raw):
                raise raw
        if _wrong_type(raw):
            raise _not_a_hash(queue, name)
        fields = record_text(raw)
        if not fields:
            return None
        # The score is not needed: a paused registration's next run is in its record.
        registration = _checked(queue, name, fields, None)
        checked = ("paused_next_ms", "cadence_digest", "last_due_ms")
        return registration, [fields.get(field, "") for field in checked]

    def trigger(self, queue: str, name: str, *, now_ms: int | None = None) -> str:
        """Fire `name` once now, as a fresh occurrence, leaving its cadence alone.

        Returns the occurrence id. `UnknownRegistration` (a `KeyError`) if there is no such
        registration, `CorruptRecord` if its record cannot be read (a pump could not send
        it): nothing is written then. One call is one trigger, even when redis-py resends it
        (a reply that timed out): the resent script finds the call's nonce and answers the
        first one's instant, so the id returned is the one a pump sends.
        """
        keys = self.keys(queue)
        validate_name(name, "registration name")
        # Lua cannot decode a definition: the record is checked here, as `read` does
        # (trigger.lua refuses a record that is not a hash, and one removed since).
        self.read(queue, name)
        now = self._now(now_ms)
        with redis_errors(f"trigger {queue}/{name}"):
            reply = self.scripts.trigger(
                keys=[keys.record(name), keys.leases],
                args=[name, now, keys.wake_channel, _call_nonce()],
            )
        if not int(reply[0]):
            raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
        # `now`, or a ms after the registration's last trigger: each trigger its own id.
        at = int(text(reply[1]))
        return occurrence_id(self.prefix, queue, name, at, triggered=True)

    # -- reads ----------------------------------------------------------------------------

    def get(self, queue: str, name: str) -> Registration | None:
        """Return the registration `name`, or None. `InvalidName` if it breaks the name rules."""
        validate_name(name, "registration name")
        found: builtins.list[Registration] = self._read(queue, [name])
        return found[0] if found else None

    def read(self, queue: str, name: str) -> Registration:
        """Return the registration `name`. `UnknownRegistration` (a `KeyError`) if there is
        none; `CorruptRecord` if its record cannot be read (edited by hand: a field of the
        wrong type), where `get` returns None and logs it."""
        validate_name(name, "registration name")
        keys = self.keys(queue)
        with redis_errors(f"read {queue}/{name}"):
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(keys.record(name))
            pipe.zscore(keys.registry, name)
            raw, score = pipe.execute(raise_on_error=False)
            if isinstance(score, Exception):
                raise score  # the registry key's type: the queue's, not this record's
        if _wrong_type(raw):
            raise _not_a_hash(queue, name)
        if isinstance(raw, Exception):
            with redis_errors(f"read {queue}/{name}"):
                raise raw
        if not raw:
            raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
        fields = record_text(raw)
        return _checked(queue, name, fields, score, unscheduled=score is None)

    def get_many(self, queue: str, names: Sequence[str]) -> builtins.dict[str, Registration]:
        """Return the registrations of `names` that exist, by name: `READ_CHUNK` a round trip,
        not one each. `InvalidName` if a name breaks the name rules."""
        for name in names:
            validate_name(name, "registration name")
        return {
            r.name: r
            for start in range(0, len(names), READ_CHUNK)
            for r in self._read(queue, names[start : start + READ_CHUNK])
        }

    def list(
        self, queue: str, *, offset: int = 0, limit: int | None = None
    ) -> builtins.list[Registration]:
        """Return the registrations of `queue` in next-run order (paused last).

        `offset` and `limit` page through that order; only the page's records are read.
        """
        _page_args(offset, limit)
        if limit == 0:
            return []
        keys = self.keys(queue)
        stop = -1 if limit is None else offset + limit - 1
        with redis_errors(f"list {queue}"):
            names = [text(n) for n in self.client.zrange(keys.registry, offset, stop)]
        return [
            r
            for start in range(0, len(names), READ_CHUNK)
            for r in self._read(queue, names[start : start + READ_CHUNK])
        ]

    def iter_list(self, queue: str) -> Iterator[Registration]:
        """Yield every registration of `queue` in next-run order, reading `READ_CHUNK` at a time.

        The names are read at once (so the order is one snapshot), the records a chunk at a
        time, so memory stays bounded by the chunk at any registry size. A registration
        removed meanwhile is left out; a member without its record (evicted, or deleted by
        hand) is left out and logged, as a corrupt record is.
        """
        keys = self.keys(queue)
        with redis_errors(f"list {queue}"):
            names = [text(n) for n in self.client.zrange(keys.registry, 0, -1)]
        for start in range(0, len(names), READ_CHUNK):
            yield from self._read(queue, names[start : start + READ_CHUNK])

    def count(self, queue: str) -> int:
        """Return how many registrations `queue` holds (ZCARD; paused ones included)."""
        keys = self.keys(queue)
        with redis_errors(f"count {queue}"):
            return int(self.client.zcard(keys.registry))

    def count_states(self, queue: str) -> dict[str, int]:
        """Return how many registrations of `queue` are `active`, `paused`, `parked` and
        `completed` (past their bounds: no run left).

        All but the active sit at score +inf: one ZCARD and one ZRANGEBYSCORE, then the
        records of those only (`FETCH_CHUNK` a call), so an active registry costs two reads.
        """
        keys = self.keys(queue)
        with redis_errors(f"count {queue}"):
            total = int(self.client.zcard(keys.registry))
            stopped = [text(n) for n in self.client.zrangebyscore(keys.registry, "+inf", "+inf")]
        counts = {"active": total - len(stopped), "paused": 0, "parked": 0, "completed": 0}
        for start in range(0, len(stopped), FETCH_CHUNK):
            chunk = stopped[start : start + FETCH_CHUNK]
            records = self.load_records(queue, chunk, ("parked_reason", "paused", "completed"))
            for name in chunk:
                record = records.get(name, {})  # one gone since: counted paused, as read
                if record.get("parked_reason"):
                    counts["parked"] += 1
                elif record.get("completed") and record.get("paused") != "1":
                    counts["completed"] += 1
                else:
                    counts["paused"] += 1
        return counts

    def names(self, queue: str, *, offset: int = 0, limit: int | None = None) -> builtins.list[str]:
        """Return the names registered in `queue`, in `list`'s order; `offset` and `limit`
        page through it (one ZRANGE, no record read)."""
        _page_args(offset, limit)
        if limit == 0:
            return []
        keys = self.keys(queue)
        stop = -1 if limit is None else offset + limit - 1
        with redis_errors(f"list {queue}"):
            return [text(n) for n in self.client.zrange(keys.registry, offset, stop)]

    def digests(
        self, queue: str, *, parked: set[str] | None = None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Return `{name: (stored digest, owner)}` for every registration of `queue`; add to
        `parked`, if given, the names a pump parked for a dispatch that could not work
        (`resume_parked`).

        One round trip for the names, then one fetch per `FETCH_CHUNK` records, each sent
        before the reply of the one before is read (`overlapped_calls`), and no decoding:
        what a sync needs to tell unchanged from changed.
        """
        names = self.names(queue)
        if not names:
            return {}
        keys = self.keys(queue)
        chunks = [names[start : start + FETCH_CHUNK] for start in range(0, len(names), FETCH_CHUNK)]
        fields = ["digest", "source"] if parked is None else ["digest", "source", "parked_dispatch"]
        calls = (([keys.record(n) for n in chunk], fields) for chunk in chunks)
        found: dict[str, tuple[str | None, str | None]] = {}
        with redis_errors(f"load {queue}"):
            replies = overlapped_calls(self.client, self.scripts.fetch, calls)
            for chunk, reply in zip(chunks, replies, strict=True):
                # A missing record, or a key that is not a hash, has neither (as `load_records`).
                for name, row in zip(chunk, json.loads(text(reply)), strict=True):
                    if isinstance(row, list) and row:
                        digest, owner = (*row, None)[:2]
                        if parked is not None and len(row) > 2 and isinstance(row[2], str):
                            parked.add(name)
                        found[name] = (
                            digest if isinstance(digest, str) else None,
                            owner if isinstance(owner, str) else None,
                        )
                    else:
                        found[name] = (None, None)
        return found

    def queues(self, *, broken: bool = False) -> builtins.list[str]:
        """Return the queues that have a registry under this prefix (SCAN; an admin read).

        With `broken`, also those whose registry key is of another type (edited by hand): a
        listing of everything (`list`, `export`) reads them and fails (WRONGTYPE) instead of
        leaving their schedules out. Without it (pumps, syncs, health, metrics, the web
        view) they are not queues, so one broken key stops none of those."""
        self._whole_keyspace("list queues")
        found: set[str] = set()
        only = {} if broken else {"_type": "zset"}
        with redis_errors("list queues"):
            for key in self.client.scan_iter(
                match=f"{_glob_escape(self.prefix)}:{{*}}:repeat", count=1000, **only
            ):
                raw = text(key)
                found.add(raw[len(self.prefix) + 2 : -len("}:repeat")])
        return sorted(found)

    def pump_queues(self, *, broken: bool = False) -> builtins.list[str]:
        """Return the queues that have a pump table under this prefix (SCAN; an admin read);
        see `HeartbeatMoves.pump_queues`. `RegistryError` on a Redis Cluster node reached
        by a plain client, as `queues`."""
        self._whole_keyspace("list pump tables")
        return super().pump_queues(broken=broken)

    def _whole_keyspace(self, action: str) -> None:
        """Raise `RegistryError` (`action` names the read) if this client is a plain one on
        a Redis Cluster node: a SCAN there sees the node's own slots only, so a listing, an
        export or a health check would answer part of the registry as if it were all of it.

        One `INFO cluster` the first time, then none. A server that refuses INFO (an ACL
        without @dangerous, a managed service) cannot tell: the read goes on, as before.
        Only the reads of the whole keyspace ask: a move on one queue's keys meets a
        redirection instead, which `redis_errors` maps to the same message.
        """
        if self._on_cluster_node is None:
            self._on_cluster_node = not self.cluster and self._cluster_enabled(action)
        if self._on_cluster_node:
            raise RegistryError(f"{action}: {CLUSTER_NODE}")

    def _cluster_enabled(self, action: str) -> bool:
        """Return whether the server says `cluster_enabled:1` (False when it refuses INFO).
        Raises `RegistryUnavailable` when it cannot be reached."""
        try:
            with redis_errors(action):
                reply = self.client.info("cluster")
        except RegistryUnavailable:
            raise
        except RegistryError as exc:
            log.debug("%s: INFO cluster refused, cannot tell a cluster node: %s", action, exc)
            return False
        return text(reply.get("cluster_enabled", 0)) == "1"

    def next_runs(self, queue: str, name: str, n: int = 5) -> builtins.list[int]:
        """Return the next `n` runs of `name` in epoch ms (`n` up to `MAX_NEXT_RUNS`).
        `UnknownRegistration` (a `KeyError`) if unknown, `CorruptRecord` if its record cannot
        be read."""
        whole_arg(n, "n", 0, MAX_NEXT_RUNS)
        return self.read(queue, name).upcoming(n)

    def _read(self, queue: str, names: Sequence[str]) -> builtins.list[Registration]:
        """The registrations of `names` that exist; a corrupt one is logged and left out (a
        member whose record is missing too: see `_read_checked`)."""
        found = []
        for registration, name, _, error in self._read_checked(queue, names):
            if registration is None:
                log.error("corrupt registration %s/%s skipped: %s", queue, name, error)
            else:
                found.append(registration)
        return found

    def _read_checked(
        self, queue: str, names: Sequence[str]
    ) -> builtins.list[tuple[Registration | None, str, dict[str, str], str]]:
        """Read the records of `names` that exist, in one pipeline: for each, the
        registration (None when corrupt), its name, its raw fields, and why it is corrupt
        (`_NOT_A_HASH`, with no fields, for a record key of another type).

        A name whose record is missing while its registry member is there (evicted, or
        deleted by hand) is a corrupt registration too, with no fields and
        `MISSING_RECORD`: a listing says so instead of leaving it out unsaid. The member is
        read after the record, and `cancel` removes both at once, so a registration removed
        meanwhile has neither (only one registered between the two reads would be taken
        for one, and logged once)."""
        keys = self.keys(queue)
        with redis_errors(f"read {queue}"):
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(keys.record(name))
                pipe.zscore(keys.registry, name)
            # Not raising on the first error reply: a record that is not a hash is that one
            # record's corruption, not the whole read's.
            replies = pipe.execute(raise_on_error=False)
            for index, reply in enumerate(replies):
                if isinstance(reply, Exception) and not (index % 2 == 0 and _wrong_type(reply)):
                    raise reply
        rows: builtins.list[tuple[Registration | None, str, dict[str, str], str]] = []
        for index, name in enumerate(names):
            raw, score = replies[2 * index], replies[2 * index + 1]
            if isinstance(raw, Exception):
                rows.append((None, name, {}, _NOT_A_HASH))
                continue
            if not raw:
                if score is not None:
                    rows.append((None, name, {}, MISSING_RECORD))
                continue
            fields = record_text(raw)
            try:
                found = _registration(queue, name, fields, score, unscheduled=score is None)
                rows.append((found, name, fields, ""))
            except (ScheduleError, ValueError) as exc:
                rows.append((None, name, fields, str(exc)))
        return rows

    def iter_checked(
        self, queue: str
    ) -> Iterator[tuple[Registration | None, str, dict[str, str], str]]:
        """`iter_list`, with the corrupt records too: for each, the registration (None when
        its record cannot be read), its name, its raw fields and why it is corrupt ('')."""
        keys = self.keys(queue)
        with redis_errors(f"list {queue}"):
            names = [text(n) for n in self.client.zrange(keys.registry, 0, -1)]
        for start in range(0, len(names), READ_CHUNK):
            yield from self._read_checked(queue, names[start : start + READ_CHUNK])

    # -- pump-facing moves ----------------------------------------------------------------

    def scan(self, queue: str, batch: int, now_ms: int | None = None) -> Scan:
        """Return what is due in `queue` at `now_ms` (default: the server's clock), at most
        `batch` (1 to `MAX_BATCH_SIZE`) names. No writes."""
        keys = self.keys(queue)
        now = self._scan_now(now_ms)
        batch = whole_arg(batch, "batch", 1, MAX_BATCH_SIZE)
        with redis_errors(f"scan {queue}"):
            reply = self.scripts.scan(
                keys=[keys.registry, keys.leases, keys.running], args=[now, batch]
            )
        return _scan_reply(reply)

    def set_aside(self, queue: str, unreadable: Sequence[tuple[str, bytes]], until_ms: int) -> None:
        """Set aside the members of `queue` a scan could not read (`Scan.unreadable`): a
        registry member is held until `until_ms` (its score raised, never lowered: `ZADD XX
        GT`, as a corrupt record is), an expired lease or an occurrence in flight is dropped
        (garbage holds no lease of ours). One round trip."""
        keys = self.keys(queue)
        sets = {"due": keys.registry, "expired": keys.leases, "lost": keys.running}
        pipe = self.client.pipeline(transaction=False)
        for where, member in unreadable:
            if where == "due":
                pipe.zadd(sets[where], {member: until_ms}, xx=True, gt=True)
            else:
                pipe.zrem(sets[where], member)
        with redis_errors(f"set aside {queue}"):
            pipe.execute()

    def scan_many(
        self, queues: Sequence[str], batch: int, now_ms: int | None = None
    ) -> builtins.list[Scan | RegistryError]:
        """Scan each of `queues` as `scan` does, all in one pipeline; one result per queue.

        One round trip whatever the number of queues (see `_script_calls`). A queue whose
        scan fails (a key of the wrong type) gets its `RegistryError` in place of its
        `Scan`, and the others are still scanned. Raises `RegistryUnavailable` when Redis
        cannot be reached.
        """
        now = self._scan_now(now_ms)
        batch = whole_arg(batch, "batch", 1, MAX_BATCH_SIZE)
        calls = [([k.registry, k.leases, k.running], [now, batch]) for k in map(self.keys, queues)]
        replies = self._script_calls(self.scripts.scan, calls, "scan", queues)
        return [r if isinstance(r, RegistryError) else _scan_reply(r) for r in replies]

    def _script_calls(
        self,
        script: Any,
        calls: Sequence[tuple[builtins.list[str], builtins.list[Any]]],
        what: str,
        names: Sequence[str],
    ) -> builtins.list[Any]:
        """Run the registered `script` once per `(keys, args)` call, all in one pipeline.

        Returns each call's reply, or the `RegistryError` it failed with (told as "<what>
        <name>", `names` holding one name per call, e.g. its queue), in order: one failing
        call does not stop the others. Raises `RegistryUnavailable` when Redis cannot be
        reached. One round trip; on a Redis Cluster, one per master holding any of the
        keys, all sent before any reply is read.
        A server that lost the script (a restart, a promoted replica) costs two more, once:
        EVALSHA is sent without the pipeline's SCRIPT EXISTS, which would cost a round trip
        every time. On a cluster whose pipeline meets a node that is gone, the calls are run
        one by one instead: a cluster pipeline retries at once, without backoff, while a
        single command backs off and follows the new slot table, so a failover is ridden
        out in one call rather than in a caller's outage and its backoff.
        """
        actions = [f"{what} {name}" for name in names]
        try:
            replies = self._pipelined(script, calls, what)
        except RegistryUnavailable:
            if not self.cluster:
                raise
            return [
                _call_or_error(script, keys, args, action)
                for (keys, args), action in zip(calls, actions, strict=True)
            ]
        lost = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
        if lost:
            with redis_errors(f"{what}: SCRIPT LOAD"):
                script.sha = self.client.script_load(script.script)
            again = self._pipelined(script, [calls[i] for i in lost], what)
            for i, reply in zip(lost, again, strict=True):
                replies[i] = reply
        return [
            _registry_error(reply, action) if isinstance(reply, Exception) else reply
            for reply, action in zip(replies, actions, strict=True)
        ]

    def _route(self, key: str) -> dict[str, Any]:
        """Return the options that send a pipelined script call on `key` to its master.

        A cluster pipeline left to find a script's keys itself asks a node (`COMMAND
        GETKEYS`) for each call, one more round trip a call; the client's slot table knows
        the node. After a failover redis-py refreshes that table and retries the calls that
        failed. Empty outside a cluster, or for a slot the table does not cover.
        """
        if not self.cluster:
            return {}
        try:
            return {"target_nodes": self.client.get_node_from_key(key)}
        except redis.exceptions.SlotNotCoveredError:
            return {}

    def _pipelined(
        self, script: Any, calls: Sequence[tuple[builtins.list[str], builtins.list[Any]]], what: str
    ) -> builtins.list[Any]:
        """Run `script` once per `(keys, args)` in one pipeline; replies and errors in order.

        An error reply stands in its call's place; a connection that fails raises
        `RegistryUnavailable` (a cluster pipeline hands such failures back as replies too).
        """
        with redis_errors(what):
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                # Not `pipe.evalsha`: a cluster pipeline blocks that method, not the command.
                pipe.execute_command(
                    "EVALSHA", script.sha, len(keys), *keys, *args, **self._route(keys[0])
                )
            replies: builtins.list[Any] = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
                raise _registry_error(reply, what)
        return replies

    def absent(self, queue: str, names: Sequence[str]) -> set[str]:
        """Return those of `names` that are not members of `queue`'s registry (one round
        trip): removed since they were read."""
        if not names:
            return set()
        with redis_errors(f"read {queue}"):
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.zscore(self.keys(queue).registry, name)
            scores = pipe.execute()
        return {name for name, score in zip(names, scores, strict=True) if score is None}

    def load_records(
        self, queue: str, names: Sequence[str], fields: Sequence[str] = DEFINITION_FIELDS
    ) -> dict[str, dict[str, str]]:
        """Return the record `fields` of `names` (the definition by default) in one round trip.

        A field the record lacks is left out; a missing record, or a record key that is not a
        hash, comes back empty.
        """
        if not names:
            return {}
        keys = self.keys(queue)
        # One script call, not a pipeline of HMGETs: the client packs one command and
        # parses one reply, which is most of the cost at hundreds of records a batch.
        with redis_errors(f"load {queue}"):
            reply = self.scripts.fetch(keys=[keys.record(n) for n in names], args=list(fields))
        # Undecodable bytes in a hand-edited record become U+FFFD, as `text` does elsewhere,
        # but in the template (`record_text`: it is corrupt then, not sent altered).
        raw = reply.decode("utf-8", "surrogateescape") if isinstance(reply, bytes) else str(reply)
        rows = json.loads(raw)
        if not raw.isascii() and not is_utf8(raw):
            rows = [_replaced_but_template(fields, row) for row in rows]
        return {
            name: {f: v for f, v in zip(fields, row, strict=False) if type(v) is str}
            if isinstance(row, list)
            else {}
            for name, row in zip(names, rows, strict=True)
        }

    def claim(
        self,
        queue: str,
        now_ms: int,
        lease_ms: int,
        candidates: Sequence[tuple[Any, ...]],
        expired: Sequence[str] = (),
        *,
        start_timeout_ms: int = START_TIMEOUT_MS,
        history_size: int = HISTORY_SIZE,
        cadence_digests: Sequence[str] = (),
        start_timeouts: Sequence[int | None] = (),
    ) -> Claim:
        """Compare-and-set claim; see `lua/claim.lua`.

        `candidates` are `(name, score_read, next_score, missed, mode[, fire_ms])`, the mode
        `"fire"`, `"defer"`, `"unread"` (a member read with no record: deferred only while it
        still has none, so one cancelled and added again is left alone), `"drop"` (the
        misfire policy fires nothing), or the overlap
        policy (`"skip"`, `"buffer_one"`, `"replace"`) of a guarded registration, which fires
        only if none of its occurrences is in flight. A guarded occurrence fired is in flight
        until a worker reports its start, at most `start_timeout_ms`; then it is lost.
        `cadence_digests`, one per candidate (or none), are the records' `cadence_digest`
        as read with the definitions the next scores were computed from ('' for none): a
        candidate whose record holds another one now is not claimed (an edit came between).
        `start_timeouts`, one per candidate (or none), replace `start_timeout_ms` for the
        guarded candidates that have one (a message that expires sooner: the dispatcher's
        `expiry_ms`).
        """
        keys = self.keys(queue)
        n = len(candidates)
        history_keys: builtins.list[str] = []
        items: builtins.list[builtins.list[str]] = []
        for index, candidate in enumerate(candidates):
            name, score, nxt, missed, mode = candidate[:5]
            # The slot that fires: the score read, unless the misfire policy chose another.
            fire = candidate[5] if len(candidate) > 5 else score
            # Numbers as strings: Lua would turn a decoded JSON number into a float.
            item = [name, str(score), str(nxt), str(missed), mode, str(fire)]
            if mode in GUARDED_MODES:
                history_keys.append(keys.history(name))
                item += [
                    str(n + 3 + len(history_keys)),
                    occurrence_id(self.prefix, queue, name, fire),
                ]
                if start_timeouts and start_timeouts[index] is not None:
                    item.append(str(start_timeouts[index]))
            items.append(item)
        args = [
            now_ms,
            now_ms + lease_ms,
            json.dumps(items),
            json.dumps(list(expired)),
            start_timeout_ms,
            history_size,
        ]
        if cadence_digests:
            args.append(json.dumps(list(cadence_digests)))
        # The record and ledger of each registration with a pending backfill due: the claim
        # judges those slots by the record as it is now (claim.lua's backfill_verdict).
        backfill_keys: builtins.list[str] = []
        places: dict[str, builtins.list[int]] = {}
        next_key = n + 4 + len(history_keys)  # KEYS index (from 1) of the next key given
        for name in _backfilling(expired):
            places[name] = [next_key + len(backfill_keys), next_key + len(backfill_keys) + 1]
            backfill_keys += [keys.record(name), keys.backfilled(name)]
        if places:
            if not cadence_digests:
                args.append("[]")  # ARGV[7]: no check
            args.append(json.dumps(places))
        with redis_errors(f"claim {queue}"):
            reply = self.scripts.claim(
                keys=[
                    keys.registry,
                    keys.leases,
                    *(keys.record(c[0]) for c in candidates),
                    keys.running,
                    *history_keys,
                    *backfill_keys,
                ],
                args=args,
            )
        claimed, released, first, first_lease, replaced, skipped, buffered, dropped = reply
        return Claim(
            [int(i) - 1 for i in claimed],
            [text(m) for m in released],
            _score(first),
            _score(first_lease),
            [(int(replaced[i]) - 1, text(replaced[i + 1])) for i in range(0, len(replaced), 2)],
            [int(i) - 1 for i in skipped],
            [int(i) - 1 for i in buffered],
            [int(i) - 1 for i in dropped],
        )

    def ack(
        self,
        queue: str,
        lease_members: Sequence[str],
        *,
        deadline_ms: int | None = None,
        released_ms: int | None = None,
        hand_back: Sequence[str] = (),
    ) -> int | None:
        """Drop the leases of occurrences the broker accepted; hand back those of `hand_back`.

        With `deadline_ms` (the deadline the caller's claim or extend wrote), only leases it
        still holds are dropped: one another pump re-took after it expired stays, for that
        pump to ack. Without it, the members are dropped whatever their deadline. With
        `released_ms` (when the pump released them, epoch ms), each lease dropped counts one
        `fired` on its registration and sets its `last_fired_ms`: `fired` counts what a
        broker accepted. The leases of `hand_back` still held at `deadline_ms` expire at once
        (deadline 0) and sleeping pumps are woken, so another pump sends them (with the same
        id, marked redelivered) on its next tick: what a stopping pump does with the
        occurrences it will not send. One script, so the batch is settled in one step.
        Returns the earliest remaining lease deadline (epoch ms), or None when none is left.
        """
        keys = self.keys(queue)
        if (hand_back or released_ms is not None) and deadline_ms is None:
            raise ValueError("counting or handing back leases needs the deadline_ms they hold")
        fence = "" if deadline_ms is None else str(deadline_ms)
        records = []
        if released_ms is not None:
            records = [keys.record(parse_lease_member(m).name) for m in lease_members]
        args = [
            fence,
            "" if released_ms is None else str(released_ms),
            keys.wake_channel,
            len(lease_members),
            *lease_members,
            *hand_back,
        ]
        with redis_errors(f"ack {queue}"):
            _, first = self.scripts.ack(keys=[keys.leases, *records], args=args)
        return _score(first)

    def park(
        self,
        queue: str,
        name: str,
        lease_members: Sequence[str],
        *,
        deadline_ms: int,
        template: str,
        reason: str,
        now_ms: int,
        code: tuple[str, int | None] | None = None,
        code_synced_ms: int | None = None,
    ) -> int:
        """Stop firing `name` after a permanent dispatch failure; see `lua/park.lua`.

        The registration is paused with `reason` (its next run kept, so `resume` brings it
        back), and the leases of `lease_members` still held at `deadline_ms` are dropped.
        `template` is the record's `template` field as the pump read it: if it changed since,
        nothing is written. `code` is the (source, generation) the failing process runs: if
        the queue holds a newer generation of that source, nothing is written either (an old
        worker of a rolling deploy); nor, with `code_synced_ms` (when the failing process's
        declarations were synced), if that source rewrote the record after it (newer code
        wrote it, when no generation tells). Returns 1 parked now, 0 parked already (leases
        dropped only), -1 no such registration (or none of the failed leases still held: it
        was cancelled since), -2 its template changed, -3 newer code is live.
        """
        keys = self.keys(queue)
        source, generation = code if code is not None else ("", None)
        synced = now_arg(code_synced_ms) if code is not None else None
        with redis_errors(f"park {queue}/{name}"):
            return int(
                self.scripts.park(
                    keys=[keys.registry, keys.record(name), keys.leases, keys.generations],
                    args=[
                        name,
                        deadline_ms,
                        template,
                        reason,
                        now_ms,
                        keys.wake_channel,
                        source,
                        generation_arg(generation, source or None),
                        "" if synced is None else synced,
                        *lease_members,
                    ],
                )
            )

    def extend(
        self, queue: str, lease_members: Sequence[str], deadline_ms: int, new_deadline_ms: int
    ) -> set[str]:
        """Move the leases still held at `deadline_ms` to `new_deadline_ms`; return those.

        A member left out was re-taken by another pump after its lease expired: the caller
        must not send it.
        """
        keys = self.keys(queue)
        with redis_errors(f"extend {queue}"):
            held = self.scripts.extend(
                keys=[keys.leases], args=[deadline_ms, new_deadline_ms, *lease_members]
            )
        return {text(member) for member in held}

    def leases(self, queue: str) -> builtins.list[tuple[str, int, int]]:
        """Return the in-flight occurrences `(name, due_ms, lease_deadline_ms)` of `queue`.

        A trigger no pump has claimed yet has the deadline 0.
        """
        keys = self.keys(queue)
        with redis_errors(f"leases {queue}"):
            raw = self.client.zrange(keys.leases, 0, -1, withscores=True)
        out = []
        for member, deadline in raw:
            try:
                lease = parse_lease_member(text(member))
            except ValueError:  # edited by hand; the next pump tick drops it
                log.error("%s: lease %r is not '<name> <due_ms>'; skipped", queue, text(member))
                continue
            out.append((lease.name, lease.due_ms, int(deadline)))
        return out


def _glob_escape(value: str) -> str:
    """Escape the glob characters of `value` for a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def _definition_fields(definition: Definition) -> dict[str, str]:
    """The record fields of `definition`, its template stored in pieces of at most 64 bytes,
    so the record stays a listpack; the digest is of the whole template (template_pieces.py)."""
    fields = definition.to_fields()
    fields.update(split_template(fields["template"]))
    return fields


def record_digest(definition: Definition, source: str | None) -> str:
    """Return the digest stored in a record: the definition's, and its owner's when it has one.

    The owner is part of it, so a change of owner is an update.
    """
    return definition.digest if source is None else _hash(definition.digest, source)


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:32]


# A pause's note and author are kept to this many characters.
MAX_PAUSE_TEXT = 500


def _pause_text(value: str | None, what: str) -> str:
    """Return a pause's `note` or `by` as stored ('' for none); `ScheduleError` if unusable."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ScheduleError(f"pause {what} must be a string, got {type(value).__name__}")
    if len(value) > MAX_PAUSE_TEXT:
        raise ScheduleError(
            f"pause {what} is {len(value)} characters; the limit is {MAX_PAUSE_TEXT}"
        )
    return value


def _missed_before_pause(registration: Registration, now_ms: int) -> int:
    """The slots of a paused `registration` that passed before its pause (its parked next
    run was overdue: no pump ran), which a resume without catch-up drops: a pause is on
    purpose for the slots after it, not for those it found missed. 0 for a parked one (a
    park is the claim's, at a slot it handled) or a Celery-decided cadence (no slot of it is
    ever counted missed), and for a pause older records do not date."""
    parked, paused_ms = registration.next_run_ms, registration.paused_ms
    if (
        parked is None
        or paused_ms is None
        or parked > paused_ms
        or registration.parked_reason is not None
    ):
        return 0
    return _unfired_slots(registration, parked, min(paused_ms, now_ms))


def _missed_at_cut_over(registration: Registration, resume_ms: int | None, now_ms: int) -> int:
    """The slots an importer's cut-over (`Repeat.resume(seed=...)`) does not fire: those
    from the slot the scheduler it replaces would fire next (`Seed.resume_ms`) to now. That
    scheduler may have sent them before it stopped without its store saying so yet, so they
    are dropped, but counted in `missed`, as every slot not fired is."""
    if resume_ms is None or resume_ms > now_ms:
        return 0
    return _unfired_slots(registration, resume_ms, now_ms)


def _unfired_slots(registration: Registration, from_ms: int, to_ms: int) -> int:
    """How many slots of `registration` lie from `from_ms` (one of them) to `to_ms`, none at
    or before its last fired slot; 0 for a Celery-decided cadence (no slot of it is ever
    counted missed)."""
    cadence = registration.definition.cadence
    last = registration.last_due_ms
    if hasattr(cadence, "check") or (last is not None and from_ms <= last):
        return 0
    end_ms = registration.definition.bounds.end_ms
    return catch_up(cadence, from_ms, to_ms, "latest", end_ms=end_ms).passed


def _flatten(fields: Mapping[str, str]) -> list[str]:
    return list(itertools.chain.from_iterable(fields.items()))


# The definition fields an upsert deletes, per set of fields written (a handful of shapes
# for any number of records: computed once each).
_STALE: dict[tuple[bool, tuple[str, ...]], list[str]] = {}
_MAX_STALE_SHAPES = 4096
# What the upsert items of one shape of definition share (`Repeat._shared_fields`): the
# fields but the template's, the fields to delete, the first run, the first run on create.
_Shared = tuple[list[str], list[str], str, str | None]
# upsert.lua's items, one JSON argument (one encoder, built once).
_PAYLOAD = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


# Registrations `resume_all` names when it drops slots that passed before their pause; the
# rest are counted in one more line (as the pump says a catch-up of many at once).
DROPPED_AT_RESUME_SHOWN = 5


def _log_dropped_at_resume(queue: str, told: Sequence[tuple[str, int]]) -> None:
    """Say which registrations a `resume_all` dropped slots of (passed before their pause
    that no pump sent, counted in missed): the first few by name, then a count."""
    for name, dropped in told[:DROPPED_AT_RESUME_SHOWN]:
        log.warning(
            "%s/%s: %d slot(s) passed before it was paused and no pump sent them; dropped "
            "at its resume, counted in missed (resume with catch-up hands them to the misfire "
            "policy)",
            queue,
            name,
            dropped,
        )
    rest = told[DROPPED_AT_RESUME_SHOWN:]
    if rest:
        log.warning(
            "%s: %d more registration(s) resumed with %d slot(s) dropped that passed before "
            "their pause, counted in missed (listed at DEBUG)",
            queue,
            len(rest),
            sum(dropped for _, dropped in rest),
        )
        for name, dropped in rest:
            log.debug("%s/%s: %d slot(s) dropped at its resume", queue, name, dropped)


def _counters(seed: Seed | None) -> dict[str, str]:
    """The run count and last run a resume from `seed` writes (none without one)."""
    if seed is None:
        return {}
    return {k: v for k, v in seed.fields().items() if k in ("fired", "last_fired_ms")}


def _share_stale(payload: list[list[Any]]) -> list[list[str]]:
    """Replace each item's list of fields to delete by its index (from 1) in the list of
    distinct ones returned: upsert.lua's ARGV[6], so a chunk sends each list once."""
    shapes: list[list[str]] = []
    index_of: dict[int, int] = {}  # id of a list (all alive in `shapes`) -> its index
    for item in payload:
        stale = item[5]
        index = index_of.get(id(stale))
        if index is None:
            shapes.append(stale)
            index = index_of[id(stale)] = len(shapes)
        item[5] = index
    return shapes


def _stale_fields(fields: Mapping[str, str], source: str | None) -> list[str]:
    """Return the definition fields (and the owner, without `source`) a record written with
    `fields` must not keep."""
    key = (source is None, tuple(fields))
    stale = _STALE.get(key)
    if stale is None:
        stale = [f for f in DEFINITION_FIELDS if f not in fields]
        if source is None:
            stale.append("source")
        if len(_STALE) < _MAX_STALE_SHAPES:
            _STALE[key] = stale
    return stale


def _registration(
    queue: str, name: str, fields: dict[str, str], score: Any, *, unscheduled: bool = False
) -> Registration:
    paused = fields.get("paused") == "1"
    next_run = _field_score(fields, "paused_next_ms") if paused else _score(score)
    # `NEVER_MS` (the claim's score for no slot): no run left, past 9999 or all excluded.
    no_run_left = next_run is not None and next_run > LATEST_MS
    return Registration(
        queue=queue,
        name=name,
        definition=Definition.from_fields(fields),
        next_run_ms=None if no_run_left else next_run,
        no_run_left=no_run_left,
        paused=paused,
        source=fields.get("source") or None,
        last_due_ms=_optional_int(fields, "last_due_ms"),
        last_fired_ms=_optional_int(fields, "last_fired_ms"),
        fired=_optional_int(fields, "fired") or 0,
        missed=_optional_int(fields, "missed") or 0,
        created_ms=_optional_int(fields, "created_ms"),
        updated_ms=_optional_int(fields, "updated_ms"),
        parked_reason=fields.get("parked_reason") or None,
        parked_ms=_optional_int(fields, "parked_ms"),
        last_status=fields.get("last_status") or None,
        last_error=fields.get("last_error") or None,
        last_started_ms=_optional_int(fields, "last_started_ms"),
        last_finished_ms=_optional_int(fields, "last_finished_ms"),
        last_duration_ms=_optional_int(fields, "last_duration_ms"),
        last_success_ms=_optional_int(fields, "last_success_ms"),
        failures=_counter(fields, "failures"),
        skipped=_counter(fields, "skipped"),
        lost=_counter(fields, "lost"),
        inflight=fields.get("inflight") or None,
        buffered_due_ms=_optional_int(fields, "buffered"),
        completed=_completed(fields),
        completed_ms=_optional_int(fields, "completed_ms"),
        # Below 0 in the record when the limit was lowered under the runs made (upsert.lua).
        remaining=max(0, _counter(fields, "remaining")) if fields.get("remaining") else None,
        paused_note=(fields.get("paused_note") or None) if paused else None,
        paused_by=(fields.get("paused_by") or None) if paused else None,
        paused_ms=_optional_int(fields, "paused_ms") if paused else None,
        backfill_dropped=_counter(fields, "backfill_dropped"),
        unscheduled=unscheduled,
    )


def _backfilling(expired: Sequence[str]) -> builtins.list[str]:
    """The names of the pending backfill members (`"<name> <slot> backfill"`) in `expired`,
    each once, in order."""
    names: dict[str, None] = {}
    for member in expired:
        if not member.endswith(" " + BACKFILL):  # most are not: no parse
            continue
        try:
            lease = parse_lease_member(member)
        except ValueError:  # garbage: the claim drops it
            continue
        if lease.pending:
            names[lease.name] = None
    return list(names)


def _not_hashes_error(names: builtins.list[str], count: int) -> CorruptRecord:
    """The error of an upsert that found record keys of another type (edited by hand): it
    wrote the other items, and none of those."""
    listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    which = f"registration {listed} is" if len(names) == 1 else f"registrations {listed} are"
    return CorruptRecord(
        f"{which} corrupt: {_NOT_A_HASH}: left as it is, the other {count - len(names)} "
        "synced; remove it (emq-bridge remove), then run this again"
    )


def _leave_alone(queue: str, name: str, verb: str, why: str) -> None:
    """Say that `pause_all`/`resume_all` left out a record key of another type, or a member
    whose record is missing: it has no flag to set or read (and never fires: a pump sets it
    aside as corrupt)."""
    if why == MISSING_RECORD:
        log.warning("%s/%s left as it is, not %s: %s", queue, name, verb, why)
        return
    log.warning(
        "%s/%s left as it is, not %s: %s; remove it, then add it again",
        queue,
        name,
        verb,
        why,
    )


def _wrong_type(error: Exception) -> bool:
    """Whether `error` is a server's WRONGTYPE reply: a key of another type."""
    return isinstance(error, redis.ResponseError) and str(error).startswith("WRONGTYPE")


def _not_a_hash(queue: str, name: str) -> CorruptRecord:
    """A record key of another type: that record's corruption alone, as `list` says (its
    cause says why, as a field's decoding error does)."""
    error = CorruptRecord(
        f"registration {queue}/{name} is corrupt: {_NOT_A_HASH} (remove it, then add it again)"
    )
    error.__cause__ = ScheduleError(_NOT_A_HASH)
    return error


def _checked(
    queue: str, name: str, fields: dict[str, str], score: Any, *, unscheduled: bool = False
) -> Registration:
    """`_registration`, or `CorruptRecord` naming the registration and what is wrong."""
    try:
        return _registration(queue, name, fields, score, unscheduled=unscheduled)
    except (ScheduleError, ValueError) as exc:
        raise CorruptRecord(
            f"registration {queue}/{name} is corrupt: {exc} (remove it, then add it again; "
            "replacing it with the same definition does not rewrite it)"
        ) from exc


def _completed(fields: Mapping[str, str]) -> Completed | None:
    reason = fields.get("completed") or None
    if reason is None:
        return None
    for known in COMPLETED_REASONS:
        if reason == known:
            return known
    return "end_at"  # edited by hand: still completed


def _counter(fields: Mapping[str, str], key: str) -> int:
    raw = fields.get(key) or "0"
    return int(raw) if raw.lstrip("-").isdigit() else 0


def _check_runs_left(
    items: Sequence[tuple[str, str, Definition]], now: int, declared: bool
) -> None:
    """Raise `ScheduleError` naming the first of `items` whose exclusions leave it no run
    from `now` (the server's clock), before any chunk is written: a call refused for it
    writes nothing. Only a cadence with exclusions can have none, so the others cost a
    type check."""
    for queue, name, definition in items:
        cadence = definition.cadence
        while isinstance(cadence, Jittered):
            cadence = cadence.inner
        if not isinstance(cadence, Excluding):
            continue
        try:
            (definition if declared else definition.for_name(name)).first_run(now, created=False)
        except ScheduleError as exc:
            raise ScheduleError(f"{queue}/{name}: {exc}") from exc
