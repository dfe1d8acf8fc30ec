"""Is the registry served? Live pumps per queue, and how late the earliest schedule is.

`check` is what `emq-bridge health` (a Kubernetes probe) asks: every queue checked has a
registry and a live pump (`heartbeat.py`), no active schedule's next run passed more than
`max_lag_ms` ago on the server's clock, and not every pump of a queue has had every send of
that queue fail for longer than that (a broker refusing them: the heartbeat's
`failing_queues`).
`unserved` is what `list` and `show` flag: a schedule whose next run passed while no live
pump serves its queue, so nothing will fire it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .cadence import NEVER_MS
from .errors import RegistryError, RegistryUnavailable
from .heartbeat import PumpInfo
from .keys import queue_names
from .registry import EVICTING_POLICIES, Registration, Repeat
from .replies import redis_errors, text

__all__ = [
    "DEFAULT_MAX_LAG_MS",
    "UNSERVED_GRACE_MS",
    "Health",
    "QueueHealth",
    "check",
    "served",
    "unserved",
]

# How late the earliest next run of a queue may be before the queue is unhealthy.
DEFAULT_MAX_LAG_MS = 60_000
# How late a schedule no pump serves is before `list` flags it: a pump restarting (a rolling
# deploy: the old one removes its heartbeat, the new one writes its own) is not flagged.
UNSERVED_GRACE_MS = 30_000


@dataclass(frozen=True, slots=True)
class QueueHealth:
    """One queue: its live pumps, and its earliest next run (epoch ms; None if it holds
    no active schedule, or none that will ever run again) with the schedule's name."""

    queue: str
    pumps: tuple[PumpInfo, ...]
    earliest_name: str | None
    earliest_ms: int | None

    def overdue_ms(self, now_ms: int) -> int:
        """Return how long ago the earliest next run passed (0 if it is not past)."""
        if self.earliest_ms is None:
            return 0
        return max(0, now_ms - self.earliest_ms)


@dataclass(frozen=True, slots=True)
class Health:
    """What `check` found: `ok`, and `reason`, one line saying why (or what is fine)."""

    ok: bool
    reason: str
    now_ms: int
    max_lag_ms: int
    queues: tuple[QueueHealth, ...] = field(default=())
    # The server's maxmemory-policy (None when neither CONFIG nor INFO may be read): one that
    # evicts any key can drop schedules, which the line then says (never the cause of a
    # failed check).
    eviction_policy: str | None = None
    # Whether the server has used its maxmemory (read only when the check failed): it then
    # refuses writes, the pumps' heartbeats among them, which is why none looks live. None
    # when a failed check could not read it (an ACL refusing INFO).
    out_of_memory: bool | None = False


def check(
    repeat: Repeat,
    queues: Sequence[str] | None = None,
    *,
    max_lag_ms: int = DEFAULT_MAX_LAG_MS,
    host: str | None = None,
) -> Health:
    """Check `queues` (default: every queue with a registry under the prefix).

    With `host`, only the pumps of that host count (`PumpInfo.host`, the name its heartbeat
    gives): the liveness probe of one pump among several on a queue, which another host's
    live pump would otherwise keep healthy while this one is stuck.

    Healthy when there is at least one queue, each has a registry (its sorted set of
    registrations, as `Repeat.queues` finds them: a queue named in `queues` whose registry
    key does not exist is unhealthy, as no queue at all is) and a live pump, and none's
    earliest active next run passed more than `max_lag_ms` ago (server clock). Costs one
    pipeline for every queue's earliest run, one for the pumps and the server's clock: three
    round trips however many queues (and the SCAN that finds them when `queues` is not
    given, and an `INFO cluster` before the first SCAN), plus one when a named queue holds
    no scheduled run (none, or all paused), to tell whether its registry exists, and one
    for the server's `maxmemory-policy` (two where CONFIG is refused: `INFO memory` then):
    one that evicts any key (`allkeys-*`) is named in the line, healthy or not, without
    failing the check (a restarted pod would not fix it; an evicted registry is often why
    a queue has none). An unhealthy check reads `INFO memory` once more: a server that has
    used its `maxmemory` refuses the pumps' heartbeats, and the line says so first
    (`out_of_memory`; None, and the line says it, when INFO is refused). Raises
    `RegistryUnavailable`/`RegistryError` when Redis fails (the
    first failing queue's error; a key of the wrong type is named; a plain client on a Redis
    Cluster node, which would see part of the queues).
    """
    if max_lag_ms < 0:
        raise ValueError("max_lag_ms must not be negative")
    found = _check(repeat, queues, max_lag_ms, host)
    policy = repeat.eviction_policy()
    reason = found.reason
    full = False if found.ok else repeat.out_of_memory()
    if full:
        reason = (
            "Redis is out of memory (used_memory has reached maxmemory): it refuses writes, "
            f"the pumps' heartbeats and sends among them; free memory or raise maxmemory ({reason})"
        )
    elif full is None:
        reason += (
            " (whether Redis is out of memory, which would refuse the pumps' heartbeats, "
            "could not be read: this user may not run INFO)"
        )
    if policy in EVICTING_POLICIES:
        reason += (
            f" (warning: maxmemory-policy is {policy}: Redis may evict schedules; "
            "set it to noeviction)"
        )
    return replace(found, reason=reason, eviction_policy=policy, out_of_memory=full)


def _check(
    repeat: Repeat, queues: Sequence[str] | None, max_lag_ms: int, host: str | None
) -> Health:
    names = list(dict.fromkeys(queue_names(queues))) if queues is not None else repeat.queues()
    pumps = repeat.pumps_by_queue(names)
    elsewhere = 0
    if host is not None:
        elsewhere = len({p.id for found in pumps.values() for p in found if p.host != host})
        pumps = {queue: [p for p in found if p.host == host] for queue, found in pumps.items()}
    found = []
    now_ms = 0
    unscored = []  # named queues whose registry holds no score: it may not exist
    # Each queue's clock and earliest score, read-only, all in one pipeline.
    for queue, scan in zip(names, repeat.scan_many(names, 1), strict=True):
        if isinstance(scan, RegistryError):
            raise _named(repeat, queue, scan)
        now_ms = scan.now_ms
        earliest = scan.due[0][0] if scan.due else None
        found.append(QueueHealth(queue, tuple(pumps[queue]), earliest, _run_ms(scan.earliest_ms)))
        if queues is not None and scan.earliest_ms is None:
            unscored.append(queue)
    if not names:
        reason = f"no queue has a registry under prefix {repeat.prefix!r}: nothing is served"
        return Health(False, reason, repeat.server_time_ms(), max_lag_ms)
    # Found by SCAN, a queue has a registry; named, it may have none (wiped, or a wrong
    # name): unhealthy as an empty prefix is, though a pump still serves it.
    missing = _missing(repeat, unscored)
    for item in found:
        if not item.pumps:
            whose = "" if host is None else f" of host {host!r}"
            reason = f"no live pump{whose} serves queue {item.queue!r}"
            if item.queue in missing:
                reason += f", which has no registry under prefix {repeat.prefix!r}"
            if host is not None:
                reason += f" ({elsewhere} live pump(s) of other hosts not counted)"
            return Health(False, reason, now_ms, max_lag_ms, tuple(found))
    for item in found:
        if item.queue in missing:
            reason = (
                f"queue {item.queue!r} has no registry under prefix {repeat.prefix!r}: no "
                f"schedule, not even a paused one (a wrong queue name or prefix, or its keys "
                f"were removed); its {len(item.pumps)} live pump(s) have nothing to fire"
            )
            return Health(False, reason, now_ms, max_lag_ms, tuple(found))
    for item in found:
        late = item.overdue_ms(now_ms)
        if late > max_lag_ms:
            what = f"{item.queue}/{item.earliest_name}" if item.earliest_name else item.queue
            reason = (
                f"{what} is {_seconds(late)} overdue (more than {_seconds(max_lag_ms)}) although "
                f"{len(item.pumps)} pump(s) serve queue {item.queue!r}: they are stuck or behind"
            )
            return Health(False, reason, now_ms, max_lag_ms, tuple(found))
    for item in found:
        # Alive but not firing: every pump of the queue has had every send fail for longer
        # than the bound (a broker refusing them). Its scores move on at each claim, so the
        # earliest next run alone never shows it.
        failing = [
            p.failing_since_ms if p.failing_queues is None else p.failing_queues.get(item.queue)
            for p in item.pumps
        ]
        if all(f is not None for f in failing):
            late = now_ms - max(f for f in failing if f is not None)
            if late > max_lag_ms:
                reason = (
                    f"every send of the {len(item.pumps)} pump(s) serving queue "
                    f"{item.queue!r} has failed for {_seconds(late)} (more than "
                    f"{_seconds(max_lag_ms)}): the broker refuses them; see the pumps' logs"
                )
                return Health(False, reason, now_ms, max_lag_ms, tuple(found))
    live = len({p.id for item in found for p in item.pumps})
    reason = (
        f"ok: {len(found)} queue(s), {live} live pump(s), "
        f"nothing overdue by more than {_seconds(max_lag_ms)}"
    )
    return Health(True, reason, now_ms, max_lag_ms, tuple(found))


def _missing(repeat: Repeat, queues: Sequence[str]) -> set[str]:
    """Return which of `queues` have no registry key (one pipeline; none if `queues` is
    empty). Its sorted set goes with its last registration: a queue whose schedules are all
    paused or past their end keeps it (their scores are +inf or far ahead)."""
    found = repeat.any_exist([[repeat.keys(q).registry] for q in queues], "read registries")
    return {queue for queue, exists in zip(queues, found, strict=True) if not exists}


def _named(repeat: Repeat, queue: str, error: RegistryError) -> RegistryError:
    """Return `error`, the scan of `queue` failing, as one line naming the key of the wrong
    type when that is its cause (a script's WRONGTYPE names no key, only the script's hash
    and line), as `emq-bridge pumps` names a pump table of the wrong type; else `error`."""
    if isinstance(error, RegistryUnavailable) or "WRONGTYPE" not in str(error):
        return error
    keys = repeat.keys(queue)
    scanned = [keys.registry, keys.leases, keys.running]  # the sorted sets scan.lua reads
    try:
        with redis_errors(f"scan {queue}"):
            pipe = repeat.client.pipeline(transaction=False)
            for key in scanned:
                pipe.type(key)
            kinds = [text(kind) for kind in pipe.execute()]
    except RegistryError:
        return error  # told as it came: the scan's own error
    wrong = [
        f"key {key!r} holds a {kind}, not a sorted set"
        for key, kind in zip(scanned, kinds, strict=True)
        if kind not in ("zset", "none")
    ]
    if not wrong:
        return error  # repaired since: the scan's own error
    named = RegistryError(f"scan {queue}: WRONGTYPE {'; '.join(wrong)} (edited by hand?)")
    named.__cause__ = error
    return named


def served(repeat: Repeat, queues: Sequence[str]) -> set[str]:
    """Return which of `queues` have a live pump (one pipeline); a pump table of another
    type counts as none (logged), so it flags, rather than stops, a listing."""
    by_queue = repeat.pumps_by_queue(queues, broken_as_none=True)
    return {queue for queue, pumps in by_queue.items() if pumps}


def unserved(registration: Registration, now_ms: int, served: set[str]) -> bool:
    """Return whether `registration` is overdue because no pump serves it: active (neither
    paused nor completed), its next run passed more than `UNSERVED_GRACE_MS` before
    `now_ms`, and its queue is not in `served` (the queues with a live pump)."""
    due = registration.next_run_ms
    return (
        not registration.paused
        and registration.completed is None  # past its end: nothing should fire it
        and due is not None
        and due < now_ms - UNSERVED_GRACE_MS
        and registration.queue not in served
    )


def _run_ms(score_ms: int | None) -> int | None:
    """The earliest score as a time, or None: `NEVER_MS` (a schedule with no run left before
    year 9999, scored there) is no time, and never overdue."""
    return None if score_ms is None or score_ms >= NEVER_MS else score_ms


def _seconds(ms: int) -> str:
    """Return a duration as `45s`, `1.5s`, `2m`, `9m14s`, `2h`, `3h05m`."""
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:g}s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 120:
        return f"{minutes}m{rest:02d}s" if rest else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
