"""The scenarios of `python -m bench.realistic`; each returns a flat dict for one repetition.

Distinct args/kwargs per registration everywhere (`realistic_workload`); the identical
template only where a row is labelled so. Every path is the one users run: `celery beat -S
emq` (`RepeatScheduler`), a Dramatiq worker's `RecurringMiddleware`, `Pump.run`, the
`emq-bridge` command line as a subprocess.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from emq_bridge import Pump, Repeat
from emq_bridge.definition import Declaration, define
from emq_bridge.keys import QueueKeys
from emq_bridge.sync import sync

from .brokers import db_url, dramatiq_broker
from .child import NullDispatcher
from .common import (
    DB_CELERY,
    DB_REGISTRY,
    EVERY_S,
    QUEUE,
    TASK,
    TEMPLATE,
    Server,
    measured,
    median,
    name_of,
    now_ms,
    percentile,
)
from .realistic_children import in_child, start_procs
from .realistic_workload import (
    SOURCE,
    args_of,
    declarations,
    decorate,
    emq_app,
    kwargs_of,
    redbeat_app,
    template_bytes,
    template_of,
    write_json,
    write_toml,
)
from .scenarios import broker_view, drain, spec_for, start_children
from .systems import EMQ_PREFIX, REDBEAT_PREFIX, Emq, RedBeat

HOUR_MS = EVERY_S * 1000


def idle_then_lead_ms(system: Emq | RedBeat, n: int) -> int:
    """Make the n schedules idle, timed; return a lead for the burst's instant that leaves
    twice that time to write the due times (a fixed lead was too short at 100,000 on a
    loaded machine: the writes ran past the instant)."""
    started = time.perf_counter()
    system.make_idle(n)
    return int((1.0 + 2 * (time.perf_counter() - started)) * 1000)


# -- 1. Celery drop-in: celery beat -S emq, beside celery-redbeat ------------------------


def celery_drop_in(
    server: Server,
    emq: Emq,
    n: int,
    cap_s: float,
    *,
    identical: bool = False,
    pipelined: bool = False,
    report: bool = True,
) -> dict[str, Any]:
    """`RepeatScheduler` (booted in a child, syncing its beat_schedule) drains n due at once."""
    params = {
        "url": server.url,
        "n": n,
        "identical": identical,
        "pipelined": pipelined,
        "report": report,
    }
    procs = start_procs([("beat", params)], timeout_s=900)
    due = now_ms() + idle_then_lead_ms(emq, n)  # the beat has synced: the records exist
    emq.make_due(n, due)
    return drain(server, list(procs), broker_view(server.url, "celery"), n, due, cap_s)


def redbeat_setup(server: Server, redbeat: RedBeat, n: int, identical: bool) -> float:
    """Store the same beat_schedule in redbeat, as `celery beat -S redbeat` does at start."""
    from redbeat.schedulers import RedBeatScheduler  # type: ignore[import-untyped]

    redbeat._close()
    started = time.perf_counter()
    RedBeatScheduler(app=redbeat_app(server.url, n, identical), lazy=False)
    redbeat._n, redbeat._every_s = n, EVERY_S
    return time.perf_counter() - started


def redbeat_drain(
    server: Server, redbeat: RedBeat, n: int, cap_s: float, identical: bool = False
) -> dict[str, Any]:
    """celery-redbeat's beat loop (bench.child, as `celery beat -S redbeat` runs it) drains
    the same n, due at once, as `bench.scenarios.prepare_burst` does, with a measured lead."""
    setup_s = redbeat_setup(server, redbeat, n, identical)
    redbeat.client.delete("redbeat::lock")  # a killed beat's lock; beat_init would wait it out
    children = start_children([spec_for(redbeat, server)])
    due = now_ms() + idle_then_lead_ms(redbeat, n)
    redbeat.make_due(n, due)
    out = drain(server, children, broker_view(server.url, "celery"), n, due, cap_s)
    out["setup_s"] = setup_s
    return out


# -- 2. Dramatiq: the middleware's pump thread, Pump.run, a bare enqueue loop -------------


def dramatiq_sync(repeat: Repeat, n: int, identical: bool = False) -> None:
    sync(repeat, declarations(n, identical), SOURCE)


def dramatiq_drain(
    server: Server,
    emq: Emq,
    n: int,
    cap_s: float,
    job: str,
    pipelined: bool | None,
    report: bool = True,
) -> dict[str, Any]:
    """n due at once, drained by a Dramatiq worker's RecurringMiddleware (`job` =
    "dramatiq-worker") or by `Pump.run` (`job` = "pump"); `pipelined` None is the default
    (automatic) choice, True the pipelined dispatcher, False one enqueue per message."""
    params: dict[str, Any] = {"url": server.url, "pipelined": pipelined, "report": report}
    if job == "pump":
        params["path"] = {None: "dramatiq-auto", True: "dramatiq-pipelined"}.get(
            pipelined, "dramatiq"
        )
    procs = start_procs([(job, params)])
    due = now_ms() + idle_then_lead_ms(emq, n)
    emq.make_due(n, due)
    return drain(server, list(procs), broker_view(server.url, "dramatiq"), n, due, cap_s)


def enqueue_loop(server: Server, n: int) -> dict[str, Any]:
    """A bare `broker.enqueue(actor.message(i, 2, ...))` loop, distinct arguments."""
    broker = dramatiq_broker(server.url)
    actor = broker.get_actor(TASK)
    view = broker_view(server.url, "dramatiq")
    broker.enqueue(actor.message(0, 2))  # connected and declared before the clock
    view.clear()
    with measured(server) as run:
        for i in range(n):
            broker.enqueue(actor.message(*args_of(i), **kwargs_of(i)))
    if view.length() != n:
        raise RuntimeError(f"the broker holds {view.length()} messages, not {n}")
    return {
        "rate": n / run["seconds"],
        "drain_s": run["seconds"],
        "round_trips_per_occ": run["round_trips"] / n,
    }


# -- 3. Boot: beat_schedule, @recurring, a TOML file, prebuilt declarations ----------------


def _boot_in_child(url: str, n: int, decorated: bool, convert: bool) -> dict[str, Any]:
    """Build the app and `RepeatScheduler(app)` as `celery beat -S emq` does, timed."""
    from emq_bridge.celery import RepeatScheduler, app_schedule

    server = Server(url)
    app = emq_app(url, n, schedule=not decorated)
    if decorated:
        decorate(app, n)
    out: dict[str, Any] = {}
    if convert:  # the conversion alone (no server), for the profile of the boot
        started = time.perf_counter()
        app_schedule(app)
        out["convert_s"] = time.perf_counter() - started
    with measured(server) as boot:
        RepeatScheduler(app=app, lazy=False)
    out.update(
        {
            "seconds": boot["seconds"],
            "writes": boot["writes"],
            "round_trips": boot["round_trips"],
            "server_commands": boot["server_commands"],
        }
    )
    return out


def boot_app(server: Server, n: int, decorated: bool) -> dict[str, Any]:
    """Boot into an empty registry, then an unchanged restart (a new process each)."""
    server.flush()
    first = in_child(_boot_in_child, server.url, n, decorated, True)
    again = in_child(_boot_in_child, server.url, n, decorated, False)
    return {
        "boot_s": first["seconds"],
        "convert_s": first["convert_s"],
        "boot_writes": first["writes"],
        "boot_round_trips": first["round_trips"],
        "restart_s": again["seconds"],
        "restart_writes": again["writes"],
        "restart_round_trips": again["round_trips"],
        "restart_server_commands": again["server_commands"],
    }


# A user's Python reads the bytecode it cached (pip writes it at install, or the first run
# of an editable install does): a PYTHONDONTWRITEBYTECODE=1 of the bench's own shell would
# make every run compile the package again, ~100 ms that no user pays.
_USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _cli(url: str, *args: str, timeout_s: float = 600.0) -> tuple[float, str]:
    """Run `emq-bridge --redis-url URL ARGS` as a user does; return (seconds, stdout)."""
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", url, *args]
    return _timed(command, timeout_s)


def _timed(command: list[str], timeout_s: float = 600.0) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=timeout_s, env=_USER_ENV
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr[-500:]}")
    return seconds, done.stdout


def boot_toml(server: Server, n: int, as_json: bool = False) -> dict[str, Any]:
    """`emq-bridge sync FILE` of an n-entry TOML file (`as_json`: the same document as a
    JSON file): into an empty registry, then again."""
    server.flush()
    url = db_url(server.url, DB_REGISTRY)
    with tempfile.TemporaryDirectory(prefix="bench-toml-") as folder:
        path = Path(folder) / ("schedules.json" if as_json else "schedules.toml")
        (write_json if as_json else write_toml)(path, n)
        before = server.raw()
        first_s, _ = _cli(url, "sync", str(path))
        middle = server.raw()
        again_s, _ = _cli(url, "sync", str(path))
        after = server.raw()
    return {
        "boot_s": first_s,
        "boot_writes": server.delta(before, middle).writes,
        "restart_s": again_s,
        "restart_writes": server.delta(middle, after).writes,
    }


def _sync_in_child(url: str, n: int, stamped: bool) -> dict[str, Any]:
    server = Server(url)
    repeat = Repeat(redis.Redis.from_url(db_url(url, DB_REGISTRY)), EMQ_PREFIX)
    started = time.perf_counter()
    declared = declarations(n)
    build_s = time.perf_counter() - started
    with measured(server) as first:
        sync(repeat, declared, SOURCE, stamp=stamped)
    with measured(server) as again:
        sync(repeat, declared, SOURCE, stamp=stamped)
    return {
        "build_s": build_s,
        "boot_s": first["seconds"],
        "boot_writes": first["writes"],
        "restart_s": again["seconds"],
        "restart_writes": again["writes"],
        "restart_round_trips": again["round_trips"],
    }


def boot_declarations(server: Server, n: int, stamped: bool = False) -> dict[str, Any]:
    """`emq_bridge.sync.sync()` of n prebuilt declarations (built untimed), then unchanged;
    `stamped`: `sync(..., stamp=True)` both times (the unchanged one finds its stamp)."""
    server.flush()
    out: dict[str, Any] = in_child(_sync_in_child, server.url, n, stamped)
    server.flush()
    return out


# -- 4. Memory: what a registration costs, and where the bytes go --------------------------

_NAME = re.compile(rb"job-\d{7}")


def stored_bytes(server: Server) -> tuple[int, int]:
    """`(dataset, keyspace)` from MEMORY STATS: what the keys hold, and the keyspace's own
    tables; unlike `used_memory`, neither counts client buffers or script caches."""
    stats: Any = server.admin.memory_stats()
    keyspace = int(stats.get("overhead.db.hashtable.lut", 0)) + sum(
        int(value.get("overhead.hashtable.main", 0))
        for key, value in stats.items()
        if key.startswith("db.") and isinstance(value, dict)
    )
    return int(stats["dataset.bytes"]), keyspace


def settle(server: Server) -> None:
    """Empty the server and let what earlier scenarios left (closed clients) go."""
    server.flush()
    time.sleep(0.5)


def key_breakdown(
    client: Any, n: int, before: tuple[int, int], after: tuple[int, int]
) -> dict[str, Any]:
    """Group the registry database's keys by family (the name replaced by `<name>`): keys and
    MEMORY USAGE per registration; the keyspace's tables per registration (MEMORY STATS);
    `unattributed`: what the dataset grew by beyond the keys' MEMORY USAGE."""
    families: dict[str, list[int]] = {}
    keys = list(client.scan_iter(count=5000))
    for start in range(0, len(keys), 5000):
        chunk = keys[start : start + 5000]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(chunk, pipe.execute(), strict=True):
            family = _NAME.sub(b"<name>", key).decode()
            slot = families.setdefault(family, [0, 0])
            slot[0] += 1
            slot[1] += int(used or 0)
    counted = sum(total for _, total in families.values())
    dataset, keyspace = after[0] - before[0], after[1] - before[1]
    return {
        "stored_bytes_per_registration": (dataset + keyspace) / n,
        "families": {
            family: {"keys": count, "bytes_per_registration": round(total / n, 1)}
            for family, (count, total) in sorted(families.items(), key=lambda kv: -kv[1][1])
        },
        "keyspace_per_registration": round(keyspace / n, 1),
        "unattributed_per_registration": round((dataset - counted) / n, 1),
    }


def record_anatomy(client: Any, key: str) -> dict[str, Any]:
    """One record: MEMORY USAGE, its encoding, its fields and each value's size."""
    kind = client.type(key).decode()
    out: dict[str, Any] = {
        "key": key,
        "type": kind,
        "memory_usage": client.memory_usage(key, samples=0),
        "encoding": client.object("encoding", key),
    }
    if isinstance(out["encoding"], bytes):
        out["encoding"] = out["encoding"].decode()
    if kind == "hash":
        values = client.hgetall(key)
        out["fields"] = len(values)
        out["field_bytes"] = {k.decode(): len(v) for k, v in values.items()}
        out["largest_value"] = max((len(v) for v in values.values()), default=0)
        limits = client.config_get("hash-max-listpack-*")
        out["listpack_limits"] = {k: int(v) for k, v in limits.items()}
    return out


def memory_emq(server: Server, repeat: Repeat, n: int, identical: bool = False) -> dict[str, Any]:
    """used_memory per registration after sync() of n distinct ~100-byte templates."""
    declared = declarations(n, identical)
    settle(server)
    before = stored_bytes(server)
    with measured(server) as first:
        sync(repeat, declared, SOURCE)
    after = stored_bytes(server)
    used = first["used_memory"]
    client = repeat.client
    keys = QueueKeys(EMQ_PREFIX, QUEUE)
    record, registry = keys.record(name_of(0)), keys.registry
    out = {
        "bytes_per_registration": used / n,
        "record_bytes": server.memory_usage(record),
        "registry_zset_bytes_per_member": (server.memory_usage(registry) or 0) / n,
        "template_bytes": statistics.mean(template_bytes(i) for i in range(n)),
        "record": record_anatomy(client, record),
        **key_breakdown(client, n, before, after),
    }
    server.flush()
    return out


def memory_redbeat(server: Server, n: int, identical: bool = False) -> dict[str, Any]:
    """used_memory per entry after celery-redbeat stored the same beat_schedule."""
    from redbeat.schedulers import RedBeatScheduler

    app = redbeat_app(server.url, n, identical)
    settle(server)
    before = stored_bytes(server)
    with measured(server) as first:
        RedBeatScheduler(app=app, lazy=False)
    after = stored_bytes(server)
    used = first["used_memory"]
    client = redis.Redis.from_url(db_url(server.url, DB_REGISTRY))
    key = f"{REDBEAT_PREFIX}{name_of(0)}"
    out = {
        "bytes_per_registration": used / n,
        "record_bytes": server.memory_usage(key),
        "record": record_anatomy(client, key),
        **key_breakdown(client, n, before, after),
    }
    client.close()
    server.flush()
    return out


# -- 5. Many queues: one pump over 1,000 queues, nothing due; a wake-up on the last -------


def queue_names(queues: int) -> list[str]:
    return [f"mq{q:04d}" for q in range(queues)]


def many_queues_sync(repeat: Repeat, queues: int, per_queue: int) -> list[str]:
    names = queue_names(queues)
    declared = [
        Declaration(
            queue,
            name_of(j),
            define(every_ms=HOUR_MS, anchor="schedule", template=template_of(q * per_queue + j)),
        )
        for q, queue in enumerate(names)
        for j in range(per_queue)
    ]
    sync(repeat, declared, SOURCE)
    return names


def idle_tick_many(server: Server, repeat: Repeat, queues: list[str], ticks: int) -> dict[str, Any]:
    pump = Pump(repeat, queues, NullDispatcher())
    pump.run_once()  # the first tick builds what later ticks reuse
    samples = []
    for _ in range(ticks):
        with measured(server) as one:
            tick = pump.run_once()
        if tick.dispatched:
            raise AssertionError("an idle tick dispatched something: the set-up is wrong")
        samples.append(one)
    return {
        "queues": len(queues),
        "idle_tick_ms": median([s["seconds"] * 1000 for s in samples]),
        "idle_tick_round_trips": median([s["round_trips"] for s in samples]),
        "idle_tick_server_commands": median([s["server_commands"] for s in samples]),
    }


def subscriptions(server: Server) -> dict[str, int]:
    """Channels and patterns subscribed on the server, and by how many connections."""
    clients = server.admin.client_list()
    subscribed = [c for c in clients if int(c.get("sub", 0)) or int(c.get("psub", 0))]
    return {
        "subscribed_connections": len(subscribed),
        "subscriptions": sum(int(c.get("sub", 0)) + int(c.get("psub", 0)) for c in subscribed),
    }


def wake_up(
    server: Server, repeat: Repeat, queues: list[str], attempts: int, cap_s: float
) -> dict[str, Any]:
    """`Pump.run` over every queue, asleep; a registration due now on the last queue: the
    time from `register` to its message in the Celery broker."""
    view = broker_view(server.url, "celery")
    [proc] = start_procs([("pump", {"url": server.url, "path": "celery", "queues": queues})])
    proc.start()
    delays: list[float] = []
    missed = 0
    try:
        time.sleep(1.5)  # the pump's first ticks, then its sleep
        subs = subscriptions(server)
        for attempt in range(attempts):
            view.clear()
            started = now_ms()
            repeat.register(
                queues[-1],
                f"wake-{attempt}-{started}",
                every_ms=HOUR_MS,
                anchor="schedule",
                template=TEMPLATE,
                now_ms=started - HOUR_MS,  # its first slot is now
            )
            seen = None
            deadline = time.monotonic() + cap_s
            while time.monotonic() < deadline:
                if view.length() > 0:
                    seen = now_ms()
                    break
                time.sleep(0.001)
            if seen is None:
                missed += 1
                continue
            delays.append(seen - started)
            time.sleep(0.3)
    finally:
        proc.kill()
    return {
        "wake_ms": median(delays),
        "wake_max_ms": max(delays, default=None),
        "wake_missed": missed,
        **subs,
    }


# -- 6. Sustained rate: 2 pumps, pipelined Celery, 10,000 occurrences/s ----------------------

_ID = re.compile(rb'"id": ?"([^"]+)"')


def _ids(raw: list[bytes]) -> list[bytes]:
    import json

    out = []
    for message in raw:
        found = _ID.search(message)
        out.append(found.group(1) if found else json.loads(message)["headers"]["id"].encode())
    return out


def sustained(
    server: Server, repeat: Repeat, rate: int, seconds: float, pumps: int
) -> dict[str, Any]:
    """`rate` registrations every second, phases spread over it (the grid's offset), pumped
    by `pumps` processes through the pipelined Celery dispatcher for `seconds`: p50/p99 of
    (sent - nominal) at the dispatch boundary, the rate achieved, duplicates read back."""
    warm_s = 1.5  # the first slots after go: pumps connect, a slot missed at start fires late
    server.flush()
    sync(repeat, declarations(rate, every_ms=1000, spread=True), SOURCE)
    params = {"url": server.url, "path": "celery-pipelined", "seconds": warm_s + seconds + 0.5}
    procs = start_procs([("pump", params)] * pumps)
    celery = redis.Redis.from_url(db_url(server.url, DB_CELERY))
    celery.delete(QUEUE)  # the warm-up messages
    go = now_ms()
    cpu_before = server.admin.info("cpu")
    for proc in procs:
        proc.start()
    seen: Counter[bytes] = Counter()
    end = go + int((warm_s + seconds + 1.0) * 1000)
    while now_ms() < end or celery.llen(QUEUE):
        raw: Any = celery.rpop(QUEUE, 5000)
        if raw:
            seen.update(_ids(raw))
        else:
            time.sleep(0.05)
    reports = [proc.result(30) for proc in procs]
    cpu_after = server.admin.info("cpu")
    for proc in procs:
        proc.kill()
    start_ms, stop_ms = go + warm_s * 1000, go + (warm_s + seconds) * 1000
    lags = [
        lag
        for report in reports
        for due, lag in zip(report["due"], report["lag"], strict=True)
        if start_ms <= due < stop_ms
    ]
    celery.close()
    server.flush()
    # Where the CPU went, per occurrence sent, over the whole run (warm-up included): the
    # pumps' processes and the server's (this reader's share of the server is in it too).
    sent = sum(len(report["due"]) for report in reports)
    server_cpu_s = sum(cpu_after[k] - cpu_before[k] for k in ("used_cpu_user", "used_cpu_sys"))
    scanned = sum(report["scanned"] for report in reports)
    return {
        "pumps": pumps,
        "pump_cpu_us_per_occ": 1e6 * sum(r["cpu_s"] for r in reports) / max(1, sent),
        "server_cpu_us_per_occ": 1e6 * server_cpu_s / max(1, sent),
        # Of what the pumps' scans found due, the share another pump's claim took first.
        "lost_to_other_pumps": 1 - sum(r["claimed"] for r in reports) / max(1, scanned),
        "target_rate": rate,
        "rate": len(lags) / seconds,
        "lag_p50_ms": percentile(lags, 50),
        "lag_p99_ms": percentile(lags, 99),
        "lag_max_ms": max(lags, default=None),
        "occurrences": len(lags),
        "messages": sum(seen.values()),
        "duplicates": sum(seen.values()) - len(seen),
    }


# -- 7. emq-bridge list --limit 50 at 100,000 schedules --------------------------------------


def list_page(server: Server, repeat: Repeat, n: int, reps: int) -> dict[str, Any]:
    """The first page as a user runs it (a subprocess), the command in-process, the page."""
    from click.testing import CliRunner

    from emq_bridge.cli import cli

    url = db_url(server.url, DB_REGISTRY)
    if repeat.count(QUEUE) != n:
        server.flush()
        sync(repeat, declarations(n), SOURCE)
    whole, inside, page, floor, python_floor = [], [], [], [], []
    runner = CliRunner()
    lines = 0
    _cli(url, "list", "--limit", "50")  # a first run writes the bytecode cache, as a user's does
    for _ in range(reps):
        seconds, out = _cli(url, "list", "--limit", "50")
        whole.append(seconds * 1000)
        lines = len(out.splitlines())
        floor.append(_cli(url, "--version")[0] * 1000)
        # What no command can go below: Python itself and its Redis client (redis-py).
        python_floor.append(_timed([sys.executable, "-c", "import redis"])[0] * 1000)
        started = time.perf_counter()
        result = runner.invoke(cli, ["--redis-url", url, "list", "--limit", "50"])
        inside.append((time.perf_counter() - started) * 1000)
        if result.exit_code != 0:
            raise RuntimeError(f"list: exit {result.exit_code}: {result.output[-300:]}")
        started = time.perf_counter()
        repeat.list(QUEUE, limit=50)
        page.append((time.perf_counter() - started) * 1000)
    return {
        "schedules": n,
        "command_ms": median(whole),
        "command_runs_ms": whole,
        "startup_floor_ms": median(floor),
        "import_redis_ms": median(python_floor),
        "in_process_ms": median(inside),
        "list_page_ms": median(page),
        "lines": lines,
    }
