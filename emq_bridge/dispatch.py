"""The `Dispatcher` protocol: the plug point that turns an occurrence into a broker message.

Adapters (`emq_bridge.celery`, `emq_bridge.dramatiq`) implement it; the core never imports
them. `ListPushDispatcher` is the adapter-free one: it pushes JSON onto a Redis list.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .cadence import Cadence
from .definition import Declaration
from .errors import DispatchError
from .occurrence import Occurrence
from .registry import Repeat
from .replies import redis_errors
from .sync import SyncPlan
from .utf8 import check_utf8

__all__ = [
    "BatchDispatcher",
    "Dispatcher",
    "ListPushDispatcher",
    "PumpTarget",
    "batch_failure",
    "occurrence_message",
]


@runtime_checkable
class Dispatcher(Protocol):
    """Hands occurrences to a broker.

    Optional: `expiry_ms(template) -> int | None`, how long after its send an occurrence of
    `template` may still be started (a message that expires, as a Celery task's `expires`),
    which bounds how long a guarded occurrence stays in flight before a worker reports its
    start (`Pump`); without it, the start timeout does.
    """

    def dispatch(self, occurrence: Occurrence) -> None:
        """Send one occurrence; return only once the broker has accepted it.

        Raise on failure: the pump then leaves the lease to expire, and a pump re-dispatches
        the occurrence with the same id (at-least-once).
        """
        ...


@dataclass(frozen=True, slots=True)
class PumpTarget:
    """What an adapter hands the `pump` command: where to send, which queues, what to sync.

    `emq_bridge.celery.load_target(spec)` and `emq_bridge.dramatiq.load_target(spec)` return
    one; `source` tags the declarations when they are synced. `resolve_cadence`, when set,
    is the `Pump(resolve_cadence=...)` hook for schedules only the adapter's process can
    compute (Celery's `solar` and custom schedule classes).

    `repeat` is the registry the application's own pumps use (Celery's beat, the workers'
    pump threads), when the adapter knows one: the command pumps it unless told otherwise,
    so a standalone pump never fires a second copy of the schedules under another prefix.
    `registry_missing` says why the application names no registry, when it names none (a
    Celery app on a non-Redis broker without `emq_bridge_redis_url`), and `registry_prefix`
    is its key prefix then: the command pumps the server the user names under that prefix,
    and refuses to guess one. `lease_ms` and `max_sleep_s` are the application's pump
    settings, when it has any;
    `history_size` the history its workers keep (the pump's skipped and lost entries are
    trimmed to it).

    `sync`, when set, is the application's own sync of what it declares, as its beat or
    workers do it at boot (its generation, its schedule file, its prune setting): the
    command syncs through it rather than `declarations` under `source` alone, so a pump never
    writes what the app itself would not (an older generation's schedules, a file left out).
    `code` is the declarations' (source, generation or None), for `Pump(code=...)`.

    `check`, when set, raises `ConfigError` unless what the application syncs itself and
    the schedule files given as `(path, declarations)` can be synced and sent as its own
    processes would (Dramatiq: each schedule names an actor of the broker on its queue); it
    writes nothing, and the command calls it before its first write.
    """

    dispatcher: Dispatcher
    queues: tuple[str, ...]
    declarations: tuple[Declaration, ...]
    source: str
    resolve_cadence: Callable[[str, str, Cadence], Cadence] | None = None
    repeat: Repeat | None = None
    lease_ms: int | None = None
    max_sleep_s: float | None = None
    history_size: int | None = None
    registry_missing: str | None = None
    registry_prefix: str | None = None
    sync: Callable[[Repeat], list[SyncPlan]] | None = None
    code: tuple[str, int | None] | None = None
    check: Callable[[Repeat, Sequence[tuple[str, Sequence[Declaration]]]], None] | None = None


@runtime_checkable
class BatchDispatcher(Protocol):
    """A dispatcher that can also send a whole claimed batch at once (an optional fast path).

    The pump prefers `dispatch_batch` when a dispatcher has it, unless the dispatcher says
    `batch_at_once` is false (an attribute or property): its `dispatch_batch` would publish
    one message after another (a broker that cannot pipeline), so the pump sends the batch
    through `dispatch`, one occurrence at a time, keeping its leases between the sends (a send
    that blocks then re-sends at most itself, not the rest of the batch: guarantees.md).
    """

    def dispatch(self, occurrence: Occurrence) -> None: ...

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> Sequence[BaseException | None]:
        """Send `occurrences`; return, for each, None once the broker accepted it, or its error.

        Raising means none was accepted.
        """
        ...


def batch_failure(exc: BaseException) -> DispatchError:
    """The error of each occurrence of a batch whose publish failed as a whole.

    Its delivery is uncertain (some messages may be in), so each is reported failed and
    re-sent with its own id when its lease expires.
    """
    failure = DispatchError(f"the broker did not take the batch: {type(exc).__name__}: {exc}")
    failure.__cause__ = exc
    return failure


def occurrence_message(occurrence: Occurrence) -> dict[str, Any]:
    """Return the JSON-ready message of an occurrence: its template plus its identity.

    `due_ms` is the nominal time (epoch ms); `redelivered` is true for a re-send after a pump
    died before its ack (the same id: deduplicate on it), `triggered` for a manual trigger.
    """
    return {
        "id": occurrence.id,
        "queue": occurrence.queue,
        "name": occurrence.name,
        "due_ms": occurrence.due_ms,
        "released_ms": occurrence.released_ms,
        "previous_due_ms": occurrence.previous_due_ms,
        "last_success_ms": occurrence.last_success_ms,
        "redelivered": occurrence.redelivered,
        "triggered": occurrence.triggered,
        "backfill": occurrence.backfill,
        "template": dict(occurrence.template),
    }


class ListPushDispatcher:
    """Push each occurrence as JSON onto the Redis list `key` (RPUSH).

    A `key` that is not valid UTF-8 raises `ScheduleError` here, not at every push.
    """

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = check_utf8(key, "list key")

    def dispatch(self, occurrence: Occurrence) -> None:
        try:
            with redis_errors(f"push {occurrence.queue}/{occurrence.name}"):
                self.client.rpush(self.key, json.dumps(occurrence_message(occurrence)))
        except Exception as exc:
            raise DispatchError(str(exc)) from exc
