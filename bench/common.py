"""What every scenario shares: the server's counters, client-side round trips, the template.

Server-side figures come from the dedicated embedded server (`INFO stats`, `INFO
commandstats`, `INFO persistence`); client-side figures (round trips, commands sent) come
from counting redis-py's socket writes in the process that does the work. Nothing is
mocked: the counters only count.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import redis
import redis.connection

# The same schedule for every system: an interval of one hour, this task, these arguments.
TASK = "bench_noop"
ARGS = [1, 2]
KWARGS = {"report": "daily", "limit": 100}
QUEUE = "bench"
EVERY_S = 3600
TEMPLATE: dict[str, Any] = {
    "task": TASK,
    "args": ARGS,
    "kwargs": KWARGS,
    "options": {"queue": QUEUE},
}

# Databases on the one embedded server: registries, Celery's broker, Dramatiq's broker.
DB_REGISTRY = 0
DB_CELERY = 1
DB_DRAMATIQ = 2


def name_of(i: int) -> str:
    """Return the registration name of schedule `i` (the same names for every system)."""
    return f"job-{i:07d}"


def now_ms() -> int:
    return int(time.time() * 1000)


def median(values: Sequence[float | None]) -> float | None:
    """Return the median of the values that are not None (None if there is none)."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the `q`-th percentile (0..100, nearest rank) of `values`."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


# -- client-side counting ---------------------------------------------------------------


@dataclass
class ClientCounts:
    """Round trips (socket writes of a command or a pipeline) and commands sent."""

    round_trips: int = 0
    commands: int = 0

    def minus(self, other: ClientCounts) -> ClientCounts:
        return ClientCounts(self.round_trips - other.round_trips, self.commands - other.commands)


CLIENT = ClientCounts()
_SHARED: list[tuple[Synchronized[int], Synchronized[int]]] = []
_STATE = {"installed": False}


def count_client_traffic(shared: tuple[Synchronized[int], Synchronized[int]] | None = None) -> None:
    """Count every round trip and command redis-py sends from this process (idempotent).

    With `shared` (two `multiprocessing.Value`s), the counts are mirrored there so a parent
    process can read a child's counts.
    """
    if shared is not None:
        _SHARED.append(shared)
    if _STATE["installed"]:
        return
    _STATE["installed"] = True
    conn = redis.connection.AbstractConnection
    send_packed: Any = conn.send_packed_command
    send_command: Any = conn.send_command
    pack_commands: Any = conn.pack_commands

    def counted_send_packed(self: Any, command: Any, check_health: bool = True) -> Any:
        CLIENT.round_trips += 1
        for trips, _ in _SHARED:
            trips.value += 1
        return send_packed(self, command, check_health)

    def counted_send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        CLIENT.commands += 1
        for _, commands in _SHARED:
            commands.value += 1
        return send_command(self, *args, **kwargs)

    def counted_pack_commands(self: Any, commands: Any) -> Any:
        commands = list(commands)
        CLIENT.commands += len(commands)
        for _, sent in _SHARED:
            sent.value += len(commands)
        return pack_commands(self, commands)

    conn.send_packed_command = counted_send_packed  # type: ignore[method-assign]
    conn.send_command = counted_send_command  # type: ignore[method-assign]
    conn.pack_commands = counted_pack_commands  # type: ignore[method-assign]


def client_snapshot() -> ClientCounts:
    return ClientCounts(CLIENT.round_trips, CLIENT.commands)


# -- server-side counting ---------------------------------------------------------------


@dataclass
class ServerCounts:
    """The server's cumulative counters at one instant."""

    commands: int
    writes: int
    used_memory: int
    per_command: dict[str, int] = field(default_factory=dict)

    def minus(self, other: ServerCounts) -> ServerCounts:
        names = set(self.per_command) | set(other.per_command)
        return ServerCounts(
            self.commands - other.commands,
            self.writes - other.writes,
            self.used_memory - other.used_memory,
            {
                n: self.per_command.get(n, 0) - other.per_command.get(n, 0)
                for n in names
                if self.per_command.get(n, 0) != other.per_command.get(n, 0)
            },
        )


class Server:
    """The dedicated embedded server's admin view: counters, memory, flush."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.admin = redis.Redis.from_url(url)
        self._overhead: ServerCounts | None = None

    def raw(self) -> ServerCounts:
        stats = self.admin.info("stats")
        persistence = self.admin.info("persistence")
        memory = self.admin.info("memory")
        per = {
            k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in self.admin.info("commandstats").items()
        }
        return ServerCounts(
            int(stats["total_commands_processed"]),
            int(persistence["rdb_changes_since_last_save"]),
            int(memory["used_memory"]),
            per,
        )

    def calibrate(self) -> None:
        """Measure what taking a snapshot itself costs, to subtract it from every delta."""
        samples = []
        for _ in range(5):
            a = self.raw()
            b = self.raw()
            samples.append(b.minus(a))
        self._overhead = min(samples, key=lambda s: s.commands)

    def delta(
        self, before: ServerCounts, after: ServerCounts, harness_commands: int = 0
    ) -> ServerCounts:
        """Return `after - before` without the snapshots' and the harness's own commands."""
        diff = after.minus(before)
        overhead = self._overhead
        if overhead is not None:
            diff.commands -= overhead.commands
            for name, calls in overhead.per_command.items():
                left = diff.per_command.get(name, 0) - calls
                if left:
                    diff.per_command[name] = left
                else:
                    diff.per_command.pop(name, None)
        diff.commands -= harness_commands
        return diff

    def flush(self) -> None:
        """Empty every database of the dedicated server and let its memory settle."""
        admin: Any = self.admin
        admin.execute_command("FLUSHALL", "SYNC")
        with contextlib.suppress(redis.ResponseError):
            self.admin.memory_purge()
        poll_until(
            lambda: int(self.admin.info("memory").get("lazyfree_pending_objects", 0)) == 0, 10.0
        )

    def memory_usage(self, key: str) -> int | None:
        value = self.admin.memory_usage(key, samples=0)
        return int(value) if value is not None else None

    def name_and_version(self) -> str:
        """`valkey 9.1.2`, or `redis 7.2.4` for a Redis server (which has no valkey_version)."""
        info = self.admin.info("server")
        if info.get("valkey_version"):
            return f"valkey {info['valkey_version']}"
        return f"redis {info.get('redis_version')}"


@contextlib.contextmanager
def measured(server: Server) -> Iterator[dict[str, Any]]:
    """Time a block in this process; yield a dict filled with wall time and counts after it."""
    out: dict[str, Any] = {}
    server_before = server.raw()
    client_before = client_snapshot()
    start = time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - start
    client = client_snapshot().minus(client_before)
    server_after = server.raw()
    # The block's own client traffic is the system under test; the snapshots are not.
    out["round_trips"] = client.round_trips
    out["commands_sent"] = client.commands
    delta = server.delta(server_before, server_after)
    out["server_commands"] = delta.commands
    out["writes"] = delta.writes
    out["used_memory"] = delta.used_memory
    out["per_command"] = delta.per_command


def poll_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.005) -> bool:
    """Call `predicate` until it holds or `timeout_s` passes; return whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
