"""The scenarios. Each returns a flat dict of figures for one system, one N, one repetition."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import redis

from .brokers import (
    celery_clear,
    celery_message_ids,
    celery_queue_length,
    db_url,
    dramatiq_clear,
    dramatiq_message_ids,
    dramatiq_queue_length,
)
from .child import ChildSpec, child_main
from .common import (
    DB_CELERY,
    DB_DRAMATIQ,
    EVERY_S,
    Server,
    client_snapshot,
    measured,
    median,
    now_ms,
    percentile,
)
from .systems import Emq, Persistent, RedBeat, System

_CTX = multiprocessing.get_context("fork")


@dataclass
class BrokerView:
    """How the bench reads one broker's bench queue."""

    length: Callable[[], int]
    ids: Callable[[], list[str]]
    clear: Callable[[], None]


def broker_view(url: str, path: str) -> BrokerView:
    if path.startswith("celery"):
        client = redis.Redis.from_url(db_url(url, DB_CELERY))
        return BrokerView(
            lambda: celery_queue_length(client),
            lambda: celery_message_ids(client),
            lambda: celery_clear(client),
        )
    client = redis.Redis.from_url(db_url(url, DB_DRAMATIQ))
    return BrokerView(
        lambda: dramatiq_queue_length(client),
        lambda: dramatiq_message_ids(client),
        lambda: dramatiq_clear(client),
    )


# -- child processes --------------------------------------------------------------------


class Child:
    """One scheduler process: ready/go events, shared traffic counters, a result pipe."""

    def __init__(self, spec: ChildSpec) -> None:
        self.ready = _CTX.Event()
        self.go = _CTX.Event()
        self.trips: Any = _CTX.Value("q", 0, lock=False)
        self.commands: Any = _CTX.Value("q", 0, lock=False)
        self.receive, send = _CTX.Pipe(duplex=False)
        self.process = _CTX.Process(
            target=child_main,
            args=(spec, self.ready, self.go, (self.trips, self.commands), send),
            daemon=True,
        )
        self.process.start()
        send.close()
        self.at_go = (0, 0)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.1):
            if not self.process.is_alive() or time.monotonic() > deadline:
                error = self.receive.recv() if self.receive.poll() else {}
                self.kill()
                raise RuntimeError(f"child did not get ready: {error}")

    def start(self) -> None:
        self.at_go = (self.trips.value, self.commands.value)
        self.go.set()

    def traffic(self) -> tuple[int, int]:
        return self.trips.value - self.at_go[0], self.commands.value - self.at_go[1]

    def result(self, timeout_s: float) -> dict[str, Any]:
        if not self.receive.poll(timeout_s):
            raise RuntimeError("child sent no result")
        got: dict[str, Any] = self.receive.recv()
        if "error" in got:
            raise RuntimeError(f"child failed: {got['error']}")
        return got

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.receive.close()


def start_children(specs: list[ChildSpec], timeout_s: float = 300.0) -> list[Child]:
    children = [Child(spec) for spec in specs]
    try:
        for child in children:
            child.wait_ready(timeout_s)
    except BaseException:
        for child in children:
            child.kill()
        raise
    return children


# -- boot sync and memory ---------------------------------------------------------------


def sync_and_memory(server: Server, system: System, n: int) -> dict[str, Any]:
    """Sync n schedules into an empty store, then again unchanged; memory in between."""
    server.flush()
    if isinstance(system, Persistent):
        system.wipe()
    with measured(server) as first:
        system.sync(n)
    out: dict[str, Any] = {
        "sync_empty_s": first["seconds"],
        "sync_empty_writes": first["writes"],
        "sync_empty_round_trips": first["round_trips"],
        "bytes_per_schedule": first["used_memory"] / n,
    }
    key = system.record_key()
    if key is not None:
        out["record_bytes"] = server.memory_usage(key)
    if isinstance(system, Persistent):
        out["file_bytes_per_schedule"] = system.file_bytes() / n
        out["bytes_per_schedule"] = None  # nothing in Redis: the schedule is a local file
    with measured(server) as second:
        system.sync(n)
    out.update(
        {
            "sync_unchanged_s": second["seconds"],
            "sync_unchanged_writes": second["writes"],
            "sync_unchanged_server_commands": second["server_commands"],
            "sync_unchanged_round_trips": second["round_trips"],
        }
    )
    if isinstance(system, Persistent):
        # Its schedule is a local shelve file: Redis figures do not apply.
        for key in (
            "sync_empty_writes",
            "sync_empty_round_trips",
            "sync_unchanged_writes",
            "sync_unchanged_server_commands",
            "sync_unchanged_round_trips",
        ):
            out[key] = None
    return out


def minimal_memory(server: Server, system: System, n: int) -> dict[str, Any]:
    """Memory per schedule with a task-only template (`{"task": ...}`), for the same N."""
    system.minimal = True
    try:
        server.flush()
        with measured(server) as first:
            system.sync(n)
        key = system.record_key()
        return {
            "bytes_per_schedule": first["used_memory"] / n,
            "record_bytes": server.memory_usage(key) if key else None,
        }
    finally:
        system.minimal = False
        server.flush()


# -- idle tick --------------------------------------------------------------------------


def idle_tick(server: Server, system: System, n: int, ticks: int) -> dict[str, Any]:
    """Tick `ticks` times with n schedules none due for an hour; medians of ticks 2..ticks."""
    if not isinstance(system, Persistent):
        system.make_idle(n)
    system.idle_tick()  # the first tick builds what later ticks reuse (connections, heap)
    samples = []
    for _ in range(ticks):
        with measured(server) as one:
            system.idle_tick()
        samples.append(one)
    if isinstance(system, RedBeat):
        system._close()  # release beat's lock for the next beat process
    in_redis = not isinstance(system, Persistent)  # its schedule is in the beat process
    return {
        "idle_tick_ms": median([s["seconds"] * 1000 for s in samples]),
        "idle_tick_round_trips": median([s["round_trips"] for s in samples]) if in_redis else None,
        "idle_tick_server_commands": median([s["server_commands"] for s in samples])
        if in_redis
        else None,
    }


# -- burst drain ------------------------------------------------------------------------


def spec_for(system: System, server: Server, **overrides: Any) -> ChildSpec:
    if isinstance(system, Emq):
        spec = ChildSpec("emq", server.url, path=system.path)
    elif isinstance(system, RedBeat):
        spec = ChildSpec("redbeat", server.url)
    else:
        assert isinstance(system, Persistent)
        spec = ChildSpec("persistent", server.url, beat_file=system.filename)
    return replace(spec, **overrides)


def lead_s(system: System, n: int) -> float:
    """Seconds between set-up and the burst's due instant: the scheduler must be idle by then."""
    if isinstance(system, Persistent):
        return 3.0 + n * 80e-6  # building the beat process and its first tick (heap) take O(N)
    return 1.0 + n * 40e-6  # writing the due scores takes O(N)


def prepare_burst(
    system: System, server: Server, n: int, count: int, **overrides: Any
) -> tuple[list[Child], int]:
    """Start `count` idle scheduler processes, then make n schedules due at one instant.

    Returns the children (ready, not yet going) and the due instant (epoch ms). The
    schedulers start before the instant, as running ones would be, and sleep until it.
    """
    if isinstance(system, RedBeat):
        system._close()
        system.client.delete("redbeat::lock")  # a killed beat's lock; beat_init would wait it out
    if isinstance(system, Persistent):
        system.wipe()
        due = now_ms() + int(lead_s(system, n) * 1000)
        spec = spec_for(
            system, server, beat_schedule_n=n, beat_last_run=due / 1000 - EVERY_S, **overrides
        )
        return start_children([spec] * count), due
    system.make_idle(n)
    children = start_children([spec_for(system, server, **overrides)] * count)
    due = now_ms() + int(lead_s(system, n) * 1000)
    system.make_due(n, due)
    return children, due


def drain(
    server: Server,
    children: list[Child],
    broker: BrokerView,
    n: int,
    due: int,
    cap_s: float,
    settle_s: float = 0.0,
) -> dict[str, Any]:
    """Let the children go; watch the broker from the due instant until it holds n messages."""
    broker.clear()  # the children's warm-up messages
    before = server.raw()
    harness_before = client_snapshot()
    for child in children:
        child.start()
    late = now_ms() > due - 200
    time.sleep(max(0.0, (due - now_ms()) / 1000 - 0.05))
    first: float | None = None
    length = 0
    elapsed = 0.0
    while True:
        length = broker.length()
        elapsed = (time.time() * 1000 - due) / 1000
        if first is None and length > 0:
            first = elapsed
        if length >= n or elapsed > cap_s:
            break
        time.sleep(0.001 if first is None else 0.005)
    if settle_s:
        time.sleep(settle_s)  # let a racing pump show a duplicate, if there is one
    traffic = [child.traffic() for child in children]
    harness = client_snapshot().minus(harness_before)
    after = server.raw()
    for child in children:
        child.kill()
    final_length = broker.length()
    delta = server.delta(before, after, harness_commands=harness.commands)
    accepted = min(length, n)
    complete = length >= n
    out: dict[str, Any] = {
        "first_ms": first * 1000 if first is not None else None,
        "complete": complete,
        "accepted": accepted,
        "drain_s": elapsed if complete else None,
        "rate": accepted / elapsed if elapsed > 0 else None,
        "cap_s": cap_s,
        "late_start": late,
    }
    if not complete and first is not None and accepted > 1:
        # Capped: extrapolate from the sending rate after the first message.
        out["drain_s_extrapolated"] = first + n / (accepted / max(1e-9, elapsed - first))
    if final_length:
        out.update(
            {
                "round_trips_per_occ": sum(t for t, _ in traffic) / final_length,
                "commands_sent_per_occ": sum(c for _, c in traffic) / final_length,
                "server_commands_per_occ": delta.commands / final_length,
            }
        )
    out["final_length"] = final_length
    return out


def burst(server: Server, system: System, n: int, cap_s: float, **overrides: Any) -> dict[str, Any]:
    """N schedules all due at one instant -> first message, all N accepted, rate, traffic."""
    broker = broker_view(server.url, system.path)
    children, due = prepare_burst(system, server, n, 1, **overrides)
    return drain(server, children, broker, n, due, cap_s)


def scale_out(server: Server, system: Emq, n: int, processes: int, cap_s: float) -> dict[str, Any]:
    """`processes` pumps drain the same burst; count duplicate occurrence ids."""
    broker = broker_view(server.url, system.path)
    children, due = prepare_burst(system, server, n, processes)
    out = drain(server, children, broker, n, due, cap_s, settle_s=0.5)
    ids = broker.ids()
    out["messages"] = len(ids)
    out["duplicates"] = len(ids) - len(set(ids))
    return out


# -- pickup latency ---------------------------------------------------------------------


def pickup(server: Server, system: System, n: int, attempts: int, cap_s: float) -> dict[str, Any]:
    """A schedule added at runtime, due 100 ms later: delay after due until the broker has it."""
    broker = broker_view(server.url, system.path)
    system.make_idle(n)
    if isinstance(system, RedBeat):
        system._close()
        system.client.delete("redbeat::lock")
    [child] = start_children([spec_for(system, server)])
    child.start()
    time.sleep(1.0)  # the scheduler settles into its idle sleep
    delays: list[float] = []
    missed = 0
    try:
        for attempt in range(attempts):
            broker.clear()
            due = now_ms() + 100
            system.add_runtime(f"pickup-{system.path}-{attempt}-{due}", due)
            deadline = time.monotonic() + 0.1 + cap_s
            seen = None
            while time.monotonic() < deadline:
                if broker.length() > 0:
                    seen = now_ms()
                    break
                time.sleep(0.001)
            if seen is None:
                missed += 1
                break  # the next attempts would wait out the same sleep
            delays.append(seen - due)
            time.sleep(0.2)
    finally:
        child.kill()
    return {
        "pickup_ms": median(delays),
        "pickup_max_ms": max(delays) if delays else None,
        "pickup_missed": missed,
        "pickup_cap_s": cap_s,
    }


# -- fire lag under load ----------------------------------------------------------------


def fire_lag(server: Server, system: System, rate: int, seconds: float) -> dict[str, Any]:
    """`rate` schedules every second, phases 1/rate s apart: p50/p99 of accepted - due."""
    server.flush()
    broker = broker_view(server.url, system.path)
    broker.clear()
    spread_ms = 1000 / rate
    lead_s = 0.5
    if isinstance(system, Persistent):
        system.wipe()
        lead_s = 3.0
        start = time.time() + lead_s
        spec = spec_for(
            system,
            server,
            mode="lag",
            seconds=seconds,
            beat_schedule_n=rate,
            beat_every_s=1,
            beat_last_run=start - 1,
            beat_spread_s=spread_ms / 1000,
        )
        [child] = start_children([spec])
    else:
        system.sync(rate, every_s=1)
        if isinstance(system, RedBeat):
            system.client.delete("redbeat::lock")
        [child] = start_children([spec_for(system, server, mode="lag", seconds=seconds)])
        system.make_due(rate, now_ms() + int(lead_s * 1000), spread_ms)
    child.start()
    try:
        lags = child.result(seconds + 120)["lags"]
    finally:
        child.kill()
    return {
        "lag_p50_ms": percentile(lags, 50),
        "lag_p99_ms": percentile(lags, 99),
        "lag_rate": len(lags) / (seconds - lead_s),
        "lag_count": len(lags),
    }
