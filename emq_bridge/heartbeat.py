"""Pump heartbeats: each running pump says, per queue it serves, that it is alive.

A heartbeat is a field of the queue's `<prefix>:{q}:pumps` hash (`heartbeat.lua`): the
pump's id, host, pid, queues, role, version, start and last tick, with an expiry on the
server's clock. A pump writes it from its loop (`Pump.step`) at most every
`HEARTBEAT_INTERVAL_S`, and removes it when it stops; a pump that dies is forgotten when its
heartbeat expires. `Repeat.pumps` reads them; `emq_bridge.health` and `emq-bridge pumps`
are built on it.

Part of `Repeat` (a base class of it, as `LifecycleMoves` is): with `registry.py` and
`lifecycle.py`, the only module that talks to the registry's keys.
"""

from __future__ import annotations

import builtins
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import EmqError, RegistryUnavailable
from .keys import QueueKeys, queue_names
from .occurrence import Occurrence
from .replies import redis_errors, text
from .scripts import Scripts
from .shown import shown
from .stamps import code_versions

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "MAX_HEARTBEAT_TTL_S",
    "Heartbeat",
    "HeartbeatMoves",
    "PumpInfo",
    "heartbeat_ttl_ms",
]

log = logging.getLogger(__name__)

# A pump writes its heartbeat at most this often (a tick in between writes nothing).
HEARTBEAT_INTERVAL_S = 5.0
# A heartbeat lives at least this long, so a slow tick or a short hiccup is not a death.
MIN_HEARTBEAT_TTL_S = 30.0
# A heartbeat given its own life lives at most a day: a dead pump shown alive longer helps
# no one (and the TTL stays far from what Redis's PX takes).
MAX_HEARTBEAT_TTL_S = 86_400.0


def heartbeat_ttl_ms(interval_s: float, max_sleep_s: float) -> int:
    """Return how long a heartbeat lives: three times the longest gap between two writes
    (the interval plus a full sleep between ticks), at least `MIN_HEARTBEAT_TTL_S`.

    ValueError unless both are finite numbers of seconds.
    """
    for value, what in ((interval_s, "interval_s"), (max_sleep_s, "max_sleep_s")):
        _check_finite(value, what)
    return round(max(MIN_HEARTBEAT_TTL_S, 3 * (interval_s + max_sleep_s)) * 1000)


def _check_finite(value: float, what: str) -> None:
    """ValueError unless `value` is a finite number (NaN and infinity have no milliseconds)."""
    try:
        finite = math.isfinite(value)
    except (TypeError, OverflowError):  # not a number; an int too big for a float
        finite = False
    if not finite:
        raise ValueError(f"{what} must be a finite number of seconds, got {shown(value)}")


@dataclass(frozen=True, slots=True)
class PumpInfo:
    """One live pump, as its heartbeat tells. Times are epoch ms on the Redis server's clock.

    `role`: where it runs (`pump`: the CLI or the API, `celery-beat`, `dramatiq-worker`);
    `tick_ms`: the end of its last tick (None before its first); `beat_ms`: when the
    heartbeat was written; `expires_ms`: when it is forgotten unless written again.
    """

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    role: str
    version: str
    started_ms: int
    tick_ms: int | None
    beat_ms: int
    expires_ms: int
    ticks: int = 0
    dispatched: int = 0
    # Since when (server clock, a tick's end) every send it made failed, none accepted; None
    # while its sends work (or it has made none).
    failing_since_ms: int | None = None
    # The same per queue: the queues whose sends all failed since then, none accepted (a
    # pump may serve one queue whose broker refuses beside others that work). None from a
    # heartbeat of a version that did not write it.
    failing_queues: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "role": self.role,
            "version": self.version,
            "started_ms": self.started_ms,
            "tick_ms": self.tick_ms,
            "beat_ms": self.beat_ms,
            "expires_ms": self.expires_ms,
            "ticks": self.ticks,
            "dispatched": self.dispatched,
            "failing_since_ms": self.failing_since_ms,
            "failing_queues": self.failing_queues,
        }


def _parse(raw: str) -> PumpInfo:
    """Decode one `pumps` field value; ValueError (or KeyError, TypeError) if it is not one."""
    expires, beat, body = raw.split(" ", 2)
    data = json.loads(body)
    tick = data.get("tick_ms")
    failing = data.get("failing_since_ms")
    by_queue = data.get("failing_queues")
    return PumpInfo(
        id=str(data["id"]),
        host=str(data["host"]),
        pid=int(data["pid"]),
        queues=tuple(str(q) for q in data["queues"]),
        role=str(data.get("role", "pump")),
        version=str(data.get("version", "")),
        started_ms=int(data["started_ms"]),
        tick_ms=None if tick is None else int(tick),
        beat_ms=int(beat),
        expires_ms=int(expires),
        ticks=int(data.get("ticks", 0)),
        dispatched=int(data.get("dispatched", 0)),
        failing_since_ms=None if failing is None else int(failing),
        failing_queues=None
        if by_queue is None
        else {str(q): int(since) for q, since in dict(by_queue).items()},
    )


class HeartbeatMoves:
    """The heartbeat moves of `Repeat` (see the module docstring)."""

    client: Any
    prefix: str
    scripts: Scripts

    def keys(self, queue: str) -> QueueKeys:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def server_time_ms(self) -> int:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def write_heartbeat(
        self, queues: Sequence[str], pump_id: str, info: dict[str, Any], ttl_ms: int
    ) -> None:
        """Write `pump_id`'s heartbeat (`info`: a JSON object) into each of `queues`' pump
        tables, alive `ttl_ms` from now on the server's clock (`heartbeat.lua`, once per
        queue). Raises `RegistryUnavailable`/`RegistryError`."""
        self._heartbeat(queues, pump_id, json.dumps(info, separators=(",", ":")), ttl_ms)

    def remove_heartbeat(self, queues: Sequence[str], pump_id: str) -> None:
        """Remove `pump_id`'s heartbeat from `queues` (a pump that stops)."""
        self._heartbeat(queues, pump_id, "", 1)

    def _script_calls(
        self,
        script: Any,
        calls: Sequence[tuple[builtins.list[str], builtins.list[Any]]],
        what: str,
        names: Sequence[str],
    ) -> builtins.list[Any]:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def _heartbeat(self, queues: Sequence[str], pump_id: str, body: str, ttl_ms: int) -> None:
        # One call per queue, each on its queue's slot, all in one pipeline: a pump of a
        # thousand queues writes them in one round trip (one per master on a cluster).
        calls = [([self.keys(q).pumps], [pump_id, body, ttl_ms]) for q in queues]
        for reply in self._script_calls(self.scripts.heartbeat, calls, "heartbeat", queues):
            if isinstance(reply, EmqError):
                raise reply  # the first queue whose write failed; the others are written

    def pumps(
        self, queues: Iterable[str] | None = None, *, broken: bool = False
    ) -> builtins.list[PumpInfo]:
        """Return the live pumps serving any of `queues` (default: every queue with a pump
        table under this prefix, found by SCAN), by id; a pump serving several queues once.

        Alive means its heartbeat has not expired on the server's clock. `broken` is
        `pump_queues`': with it, a pump table of another type fails the read (WRONGTYPE).
        """
        names = self.pump_queues(broken=broken) if queues is None else list(queue_names(queues))
        found: dict[str, PumpInfo] = {}
        for infos in self.pumps_by_queue(names).values():
            for info in infos:
                found.setdefault(info.id, info)
        return [found[key] for key in sorted(found)]

    def pumps_by_queue(
        self, queues: Sequence[str], *, broken_as_none: bool = False
    ) -> dict[str, builtins.list[PumpInfo]]:
        """Return, for each of `queues`, the live pumps whose heartbeat is in its table (one
        pipeline, and the server's clock). A heartbeat edited into garbage is left out
        (logged). A pump table of another type (edited by hand) fails the read (WRONGTYPE),
        or, with `broken_as_none` (views that only flag unserved schedules: `list`, `show`,
        the web view's schedules), reads as no pump, logged."""
        names = queue_names(queues)
        if not names:
            return {}
        with redis_errors("read pumps"):
            pipe = self.client.pipeline(transaction=False)
            for queue in names:
                pipe.hgetall(self.keys(queue).pumps)
            replies = pipe.execute(raise_on_error=not broken_as_none)
        now_ms = self.server_time_ms()
        out: dict[str, builtins.list[PumpInfo]] = {}
        for queue, reply in zip(names, replies, strict=True):
            live = out.setdefault(queue, [])
            if isinstance(reply, Exception):  # an error reply (a lost connection raises)
                log.error("%s: its pump table cannot be read, taken as no pump: %s", queue, reply)
                continue
            for key, raw in sorted((reply or {}).items()):
                try:
                    info = _parse(text(raw))
                except (ValueError, KeyError, TypeError) as exc:
                    log.error(
                        "%s: the heartbeat of pump %s is unreadable: %s", queue, text(key), exc
                    )
                    continue
                if info.expires_ms > now_ms:
                    live.append(info)
        return out

    def pump_queues(self, *, broken: bool = False) -> builtins.list[str]:
        """Return the queues that have a pump table under this prefix (SCAN; an admin read).

        With `broken`, also those whose pump table is of another type (edited by hand), as
        `Repeat.queues(broken=True)` does for registries: a listing of every pump (`emq-bridge
        pumps`) reads them and fails (WRONGTYPE) instead of saying that no pump runs, as
        `health` and `pumps QUEUE` do."""
        found: set[str] = set()
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix)  # glob-escaped
        only = {} if broken else {"_type": "hash"}
        with redis_errors("list pump tables"):
            for key in self.client.scan_iter(match=f"{pattern}:{{*}}:pumps", count=1000, **only):
                raw = text(key)
                found.add(raw[len(self.prefix) + 2 : -len("}:pumps")])
        return sorted(found)


def _version() -> str:
    # The distribution's: the package root imports the pump, which imports this module.
    # '' when run from a source tree that is not installed.
    return code_versions("emq-bridge")[0] or "unknown"


class Heartbeat:
    """The heartbeat of one pump: written from its loop, at most every `interval_s`.

    `role` names where the pump runs (the adapters set it). A failed write is logged once
    (until one works again) and never stops the pump: a pump that cannot write its heartbeat
    cannot reach the registry either, and the tick reports that.
    """

    def __init__(
        self,
        queues: Sequence[str],
        *,
        max_sleep_s: float,
        ttl_s: float | None = None,
        role: str = "pump",
    ) -> None:
        _check_finite(max_sleep_s, "max_sleep_s")
        if ttl_s is None:
            self.interval_s = HEARTBEAT_INTERVAL_S
            self.ttl_ms = heartbeat_ttl_ms(self.interval_s, max_sleep_s)
        else:
            _check_finite(ttl_s, "ttl_s")
            if not 0 < ttl_s <= MAX_HEARTBEAT_TTL_S:
                raise ValueError(
                    f"a heartbeat lives more than 0 and at most {MAX_HEARTBEAT_TTL_S:g}s "
                    f"(a day), not {ttl_s:g}s"
                )
            # Written three times a lifetime, so one slow tick is not a death.
            self.interval_s = min(HEARTBEAT_INTERVAL_S, ttl_s / 3)
            if not ttl_s > self.interval_s + max_sleep_s:
                # The least life that holds: a third of it (the interval) plus a sleep, or,
                # past three intervals, the full interval plus a sleep.
                if max_sleep_s <= 2 * HEARTBEAT_INTERVAL_S:
                    least = 1.5 * max_sleep_s
                else:
                    least = HEARTBEAT_INTERVAL_S + max_sleep_s
                raise ValueError(
                    f"a heartbeat of {ttl_s:g}s would expire while its pump sleeps: give more "
                    f"than {least:g}s (a third of it, the interval between heartbeats, and a "
                    f"sleep of {max_sleep_s:g}s)"
                )
            self.ttl_ms = round(ttl_s * 1000)
        self.queues = tuple(queues)
        self.role = role
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.version = _version()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        # The pump's start on the server's clock, as every time a heartbeat carries (this
        # host's may be off, and readers compare it with the server's): unknown until the
        # first server time seen (`_anchor_start`), timed back from then on the monotonic clock.
        self._made_at = time.monotonic()
        self.started_ms: int | None = None
        self.ticks = 0
        self.dispatched = 0
        self._written_at: float | None = None
        self._tick_ms: int | None = None
        self._failing = False
        self._failing_since_ms: int | None = None
        self._failing_queues: dict[str, int] = {}

    def info(self) -> dict[str, Any]:
        """Return the JSON object the heartbeat carries."""
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "role": self.role,
            "version": self.version,
            "started_ms": self.started_ms,
            "tick_ms": self._tick_ms,
            "ticks": self.ticks,
            "dispatched": self.dispatched,
            "failing_since_ms": self._failing_since_ms,
            "failing_queues": self._failing_queues,
        }

    def tick(
        self,
        repeat: HeartbeatMoves,
        now_ms: int,
        dispatched: int,
        failed: int = 0,
        *,
        sent: Sequence[Occurrence] = (),
        refused: Sequence[Occurrence] = (),
    ) -> bool:
        """Count a tick that ended at `now_ms` (server clock), its sends accepted and failed
        (`sent` and `refused`, the occurrences, say in which queues); write the heartbeat if
        `interval_s` passed since the last write. Return whether it was written. A send
        accepted ends a failing spell; a tick whose sends all failed starts one
        (`failing_since_ms`: what `health` reads of a pump alive but not firing), and so per
        queue (`failing_queues`)."""
        self.ticks += 1
        self.dispatched += dispatched
        if dispatched:
            self._failing_since_ms = None
        elif failed and self._failing_since_ms is None:
            self._failing_since_ms = now_ms
        if refused or self._failing_queues:
            worked = {o.queue for o in sent}
            for queue in worked:
                self._failing_queues.pop(queue, None)
            for queue in {o.queue for o in refused} - worked:
                self._failing_queues.setdefault(queue, now_ms)
        self._tick_ms = now_ms
        if self.started_ms is None:
            self._anchor_start(now_ms)
        if self._written_at is not None and time.monotonic() - self._written_at < self.interval_s:
            return False
        return self.write(repeat)

    def write(self, repeat: HeartbeatMoves) -> bool:
        """Write the heartbeat now; return whether it worked (a failure is logged once)."""
        try:
            if self.started_ms is None:  # written before any tick: one TIME, once
                self._anchor_start(repeat.server_time_ms())
            repeat.write_heartbeat(self.queues, self.id, self.info(), self.ttl_ms)
        except EmqError as exc:
            if not self._failing:
                # Redis gone is the pump's outage, which the pump logs once itself; any other
                # failure (a refused script) leaves the probes blind, so it is a warning.
                level = logging.INFO if isinstance(exc, RegistryUnavailable) else logging.WARNING
                log.log(level, "the pump's heartbeat could not be written: %s", exc)
            self._failing = True
            return False
        self._written_at = time.monotonic()
        self._failing = False
        return True

    def _anchor_start(self, server_now_ms: int) -> None:
        """Set `started_ms`: `server_now_ms` (the server's clock) less the time this heartbeat
        has existed, on the monotonic clock."""
        lived_ms = int((time.monotonic() - self._made_at) * 1000)
        self.started_ms = max(0, server_now_ms - lived_ms)

    def remove(self, repeat: HeartbeatMoves) -> None:
        """Remove the heartbeat (the pump stops); a failure is logged: it expires anyway."""
        if self._written_at is None:
            return
        try:
            repeat.remove_heartbeat(self.queues, self.id)
        except EmqError as exc:
            # It expires on its own; an outage at stop was told by the pump already.
            log.debug("the pump's heartbeat could not be removed (it expires): %s", exc)
        self._written_at = None
