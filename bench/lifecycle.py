"""The occurrence lifecycle's costs: worker throughput with reporting on and off, and memory.

    python -m bench.lifecycle            # the full run (about 8 minutes on 2 cores)
    python -m bench.lifecycle --quick    # a smoke run (about 1 minute)
    python -m bench.lifecycle --framework dramatiq --pairs 3   # one framework's throughput

One embedded server, one run, side by side:

1. **Worker throughput** of a no-op task with worker-side reporting on and off, on a real
   Celery worker (prefork, concurrency 2, Redis broker) and a real Dramatiq worker
   (`RedisBroker`, 2 processes), both on the bench's server. Each repetition, the pump sends
   N occurrences through the real dispatcher (`CeleryDispatcher` / `DramatiqDispatcher`,
   with their ids, headers and options) while no worker runs; then a worker starts and the
   clock runs from the first task's start to the last task's end, as the worker processes
   themselves read it. Repetitions alternate off and on (off-on, on-off, ...), and the table
   gives the medians and the ratio on/off, with the CPU per task (every worker process, and
   the server) and the round trips reporting adds. The registrations' histories are full
   (50 entries) before the first repetition: the steady state of a long-running deployment.
   With reporting on, the run waits until every task's reports were applied, says how long
   after the last task that was, and checks that every occurrence's `succeeded` is in its
   history.
2. **What one report costs**: `Repeat.report` calls of 2, 20 and 200 reports from the bench
   process, against histories of 50 entries and of 1: client time, server CPU and server
   commands per report.
3. **Memory per registration**: `used_memory` before and after N registrations that have
   fired once, then again after each got a full history of 50 occurrences through
   `Repeat.report` (started and finished, some failures with their errors, a retry, a
   skip), and `MEMORY USAGE` of one record and of one history.

A plain run writes `bench/results/<UTC time>-lifecycle[-quick].json` and `.md` (git-ignored);
`--out bench/runs/2026-12-01-lifecycle` writes a pair to commit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import redis

from emq_bridge import Pump, Repeat, define, occurrence_id
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.keys import QueueKeys
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import HISTORY_SIZE, HistoryEntry, Report

from .brokers import celery_app, db_url, dramatiq_broker
from .common import (
    DB_CELERY,
    DB_DRAMATIQ,
    DB_REGISTRY,
    QUEUE,
    TEMPLATE,
    Server,
    name_of,
)
from .output import REPO, RESULTS_DIR, describe_server, output_paths, portable_arg
from .run import Results, log, machine, publish, step

PREFIX = "lc"
HOUR_MS = 3_600_000
FRAMEWORKS = ("celery", "dramatiq")
# The registry queue of each framework's registrations (the messages go to QUEUE, "bench").
REGISTRY_QUEUE = {"celery": "lc-celery", "dramatiq": "lc-dramatiq"}
ARMS = ("off", "on")
WORKER_MODULE = "bench.lifecycle_worker"


@dataclass
class Plan:
    """How much to run. N = registrations x slots occurrences per repetition: `slots` for
    Celery, `dramatiq_slots` for Dramatiq, so that a repetition of either lasts several
    seconds of a worker's steady state (a short one measures its first and last moments as
    much as its throughput: a Celery repetition of 5,000 tasks lasted about 5 s)."""

    registrations: int
    slots: int
    dramatiq_slots: int
    pairs: int  # repetitions of each arm (on and off) per framework
    memory_n: int
    history: int = HISTORY_SIZE
    celery_concurrency: int = 2
    dramatiq_processes: int = 2
    dramatiq_threads: int = 8
    run_cap_s: float = 120.0
    settle_cap_s: float = 60.0
    cost_occurrences: int = 5000
    cost_batches: tuple[int, ...] = (2, 20, 200)
    frameworks: tuple[str, ...] = FRAMEWORKS  # whose throughput is measured

    @property
    def n(self) -> int:
        return self.registrations * self.slots

    def of(self, framework: str) -> Plan:
        """This plan as `framework` runs it (its slots a repetition)."""
        return self if framework == "celery" else replace(self, slots=self.dramatiq_slots)


def plan_for(quick: bool) -> Plan:
    if quick:
        return Plan(
            registrations=200,
            slots=5,
            dramatiq_slots=5,
            pairs=1,
            memory_n=200,
            cost_occurrences=1000,
        )
    return Plan(registrations=1000, slots=20, dramatiq_slots=20, pairs=3, memory_n=1000)


# What reports, on the worker side: the adapters' own reporting, switched by their setting.
REPORTING = {
    "celery": "emq_bridge.celery's signal receivers, app.conf.emq_bridge_report = True / False",
    "dramatiq": "RecurringMiddleware(report=True / False, run_pump=False, sync_at_boot=False)",
}


# -- the registry: registrations, full histories, occurrences fired ---------------------------

ERRORS = (
    TimeoutError("GET https://api.example.com/v1/reports timed out after 30.0 s"),
    ConnectionError("upstream db-replica-2:5432 refused the connection (attempt 3 of 3)"),
    ValueError("invoice 2026-11-0042 has no customer id"),
)


def occurrence_reports(
    queue: str, name: str, due_ms: int, j: int, *, full: bool = True
) -> list[Report]:
    """The reports a worker sends of occurrence `j` of `name`, due at `due_ms`.

    `full`: started, then the end (a failure every tenth, with its error; one retry of 25,
    run again and succeeding; one skip). Otherwise only `succeeded`, which is enough to fill
    a history fast.
    """
    occurrence = {
        "id": occurrence_id(PREFIX, queue, name, due_ms),
        "queue": queue,
        "name": name,
        "due_ms": due_ms,
        "released_ms": due_ms + 3,
    }
    if not full:
        return [report_of("succeeded", occurrence, at_ms=due_ms + 180)]
    start = due_ms + 12
    run_ms = 40 + (j * 37) % 900
    if j % 25 == 20:
        return [report_of("skipped", occurrence, at_ms=due_ms + 5)]
    if j % 25 == 12:
        return [
            report_of("started", occurrence, at_ms=start),
            report_of(
                "retrying",
                occurrence,
                at_ms=start + run_ms,
                error=ERRORS[1],
                hold_ms=60_000,
            ),
            report_of("started", occurrence, attempt=2, at_ms=start + 60_000),
            report_of("succeeded", occurrence, attempt=2, at_ms=start + 60_000 + run_ms),
        ]
    if j % 10 == 9:
        error = ERRORS[(j // 10) % len(ERRORS)]
        return [
            report_of("started", occurrence, at_ms=start),
            report_of("failed", occurrence, at_ms=start + run_ms, error=error),
        ]
    return [
        report_of("started", occurrence, at_ms=start),
        report_of("succeeded", occurrence, at_ms=start + run_ms),
    ]


def fill_histories(
    repeat: Repeat,
    queue: str,
    names: Sequence[str],
    first_due_ms: int,
    count: int,
    *,
    full: bool = True,
    chunk: int = 1000,
    history_size: int = HISTORY_SIZE,
) -> int:
    """Send `count` occurrences' reports for each of `names` through `Repeat.report`, oldest
    first; return how many reports were sent."""
    sent = 0
    pending: list[Report] = []
    for j in range(count):
        due = first_due_ms + j * HOUR_MS
        for name in names:
            pending += occurrence_reports(queue, name, due, j, full=full)
            if len(pending) >= chunk:
                repeat.report(pending, history_size=history_size)
                sent, pending = sent + len(pending), []
    if pending:
        repeat.report(pending, history_size=history_size)
        sent += len(pending)
    return sent


def register(repeat: Repeat, queue: str, n: int, now_ms: int) -> int:
    """Register schedules 0..n-1 hourly with the bench's template; return the first slot."""
    # Anchored on `now_ms` (not the hour grid), so the first slot is `now_ms + 1 h`.
    definition = define(every_ms=HOUR_MS, anchor="schedule", template=TEMPLATE)
    repeat.upsert_many([(queue, name_of(i), definition) for i in range(n)], now_ms=now_ms)
    return now_ms + HOUR_MS


class Counting:
    """Accept every occurrence without sending it (the memory scenario fires once)."""

    def __init__(self) -> None:
        self.count = 0

    def dispatch(self, occurrence: Any) -> None:
        self.count += 1


# -- the workers -------------------------------------------------------------------------------


def worker_command(framework: str, plan: Plan) -> list[str]:
    if framework == "celery":
        return [
            *(sys.executable, "-m", "celery", "-A", f"{WORKER_MODULE}:app", "worker"),
            *("-P", "prefork", "-c", str(plan.celery_concurrency), "-Q", QUEUE),
            *("--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "warning"),
        ]
    return [
        *(sys.executable, "-m", "dramatiq", WORKER_MODULE),
        *("--processes", str(plan.dramatiq_processes), "--threads", str(plan.dramatiq_threads)),
        *("--queues", QUEUE),
    ]


@dataclass
class WorkerStats:
    tasks: int
    first_start: float
    last_finish: float
    report_calls: int
    reports: int
    outcome_reports: int
    registry_round_trips: int
    processes: int


def read_stats(folder: Path) -> WorkerStats:
    rows = []
    for path in folder.glob("*.json"):
        try:
            rows.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # being replaced right now: read it next time
            continue
    ran = [r for r in rows if r["tasks"]]
    return WorkerStats(
        tasks=sum(r["tasks"] for r in rows),
        first_start=min((r["first_start"] for r in ran), default=0.0),
        last_finish=max((r["last_finish"] for r in ran), default=0.0),
        report_calls=sum(r["report_calls"] for r in rows),
        reports=sum(r["reports"] for r in rows),
        outcome_reports=sum(r["outcome_reports"] for r in rows),
        registry_round_trips=sum(r["registry_round_trips"] for r in rows),
        processes=len(ran),
    )


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# How often the bench reads the workers' stats files while they run. Its reads take CPU from
# the workers and the server, which share two CPUs: read every 5 ms instead of every 0.5 s,
# a Celery worker's main process took about a fifth more CPU for the same 5,000 tasks. The
# clock is the workers' own (first start to last finish), so this only places the edges of
# the CPU window, which counts the tasks inside it.
POLL_S = 0.05


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the processes of process group `pgid`."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def server_cpu_s(server: Server) -> float:
    info = server.admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Worker:
    """One real worker (Celery or Dramatiq) started on `bench.lifecycle_worker`."""

    def __init__(self, framework: str, plan: Plan, url: str, report: bool) -> None:
        self.stats_dir = Path(tempfile.mkdtemp(prefix="emq-lifecycle-"))
        self.log_path = self.stats_dir / "worker.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "LC_URL": db_url(url, DB_REGISTRY),
            "LC_PREFIX": PREFIX,
            "LC_REPORT": "on" if report else "off",
            "LC_STATS": str(self.stats_dir),
            "LC_WORKER": framework,
        }
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                worker_command(framework, plan),
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its pool is stopped with it, by this pid's group
            )

    def stats(self) -> WorkerStats:
        return read_stats(self.stats_dir)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.stats_dir, ignore_errors=True)


# -- scenario 1: worker throughput, reporting on and off --------------------------------------


class Framework:
    """One framework's registrations, its dispatcher and its broker's queue on the server."""

    def __init__(self, name: str, server: Server, plan: Plan) -> None:
        self.name = name
        self.plan = plan
        self.server = server
        self.queue = REGISTRY_QUEUE[name]
        self.client = redis.Redis.from_url(db_url(server.url, DB_REGISTRY))
        self.repeat = Repeat(self.client, PREFIX)
        self.keys = QueueKeys(PREFIX, self.queue)
        self.names = [name_of(i) for i in range(plan.registrations)]
        if name == "celery":
            from emq_bridge.celery import CeleryDispatcher

            self.dispatcher: Any = CeleryDispatcher(celery_app(server.url))
            self.broker = redis.Redis.from_url(db_url(server.url, DB_CELERY))
            self.pending: Callable[[], int] = lambda: int(self.broker.llen(QUEUE))
        else:
            from emq_bridge.dramatiq import DramatiqDispatcher

            self.dispatcher = DramatiqDispatcher(dramatiq_broker(server.url))
            self.broker = redis.Redis.from_url(db_url(server.url, DB_DRAMATIQ))
            self.pending = lambda: int(self.broker.hlen(f"dramatiq:{QUEUE}.msgs"))
        self.pump = Pump(self.repeat, [self.queue], self.dispatcher)
        self.next_slot = 0

    def set_up(self) -> dict[str, Any]:
        """Register, and give every registration a full history (the steady state)."""
        total_slots = self.plan.history + (2 * self.plan.pairs + 1) * self.plan.slots
        start = int(time.time() * 1000) - (total_slots + 2) * HOUR_MS
        first = register(self.repeat, self.queue, self.plan.registrations, start)
        began = time.perf_counter()
        # The history's occurrences come before the first slot the pump fires.
        sent = fill_histories(
            self.repeat,
            self.queue,
            self.names,
            first - self.plan.history * HOUR_MS,
            self.plan.history,
            full=False,
        )
        self.next_slot = first
        return {"history_reports": sent, "history_fill_s": time.perf_counter() - began}

    def fire(self) -> tuple[int, int]:
        """Send the next `slots` slots of every registration; return (first due, count)."""
        first, sent = self.next_slot, 0
        for _ in range(self.plan.slots):
            tick = self.pump.run_once(now_ms=self.next_slot)
            if tick.failed:
                raise AssertionError(f"{len(tick.failed)} occurrence(s) failed to send")
            sent += len(tick.dispatched)
            self.next_slot += HOUR_MS
        return first, sent

    def succeeded(self, first_due: int) -> int:
        """How many of the occurrences due from `first_due` on are `succeeded` in history."""
        pipe = self.client.pipeline(transaction=False)
        for name in self.names:
            pipe.lrange(self.keys.history(name), 0, self.plan.slots + 4)
        done = 0
        for raw in pipe.execute():
            for item in raw:
                entry = HistoryEntry.from_json(item.decode())
                if entry.due_ms >= first_due and entry.status == "succeeded":
                    done += 1
        return done


def throughput(framework: Framework, report: bool) -> dict[str, Any]:
    """One repetition: N occurrences sent, then a worker runs them all (see the docstring).

    CPU is read when the first task is seen and after the last task (with reporting on:
    after the last report was applied), so the worker's boot is not in it: per task, it is
    the CPU of that window over the tasks run in it.
    """
    plan, server = framework.plan, framework.server
    first_due, sent = framework.fire()
    n = plan.n
    if sent != n or framework.pending() != n:
        raise AssertionError(f"the broker holds {framework.pending()} of {n} ({sent} sent)")
    before = server.raw()
    worker = Worker(framework.name, plan, server.url, report)
    cpu_at_first: tuple[float, float, int] | None = None
    figures: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + plan.run_cap_s
        while True:
            stats = worker.stats()
            if cpu_at_first is None and stats.tasks:
                cpu_at_first = (group_cpu_s(worker.proc.pid), server_cpu_s(server), stats.tasks)
            if stats.tasks >= n:
                break
            if not worker.alive() or time.monotonic() > deadline:
                raise AssertionError(
                    f"the worker ran {stats.tasks} of {n} tasks:\n{worker.output()}"
                )
            time.sleep(POLL_S)
        if report:
            # Every task's started and succeeded applied by `Repeat.report` (the workers'
            # own count): how long after the last task that was.
            settle_by = time.monotonic() + plan.settle_cap_s
            while stats.outcome_reports < 2 * n and time.monotonic() < settle_by:
                time.sleep(0.005)
                stats = worker.stats()
            if stats.outcome_reports >= 2 * n:
                figures["settled_after_last_task_ms"] = (time.time() - stats.last_finish) * 1000
        worker_cpu, server_cpu = group_cpu_s(worker.proc.pid), server_cpu_s(server)
        after = server.raw()
        time.sleep(0.1)
        stats = worker.stats()
    finally:
        worker.stop()
    if cpu_at_first is None:
        raise AssertionError("no task was seen")
    delta = server.delta(before, after)
    counted = n - cpu_at_first[2]
    worker_us = (worker_cpu - cpu_at_first[0]) / counted * 1e6
    server_us = (server_cpu - cpu_at_first[1]) / counted * 1e6
    wall = stats.last_finish - stats.first_start
    if report:
        figures["reports_landed"] = framework.succeeded(first_due)
    figures.update(
        {
            "tasks": stats.tasks,
            "worker_processes": stats.processes,
            "wall_s": wall,
            "tasks_per_s": n / wall,
            "worker_cpu_us_per_task": worker_us,
            "server_cpu_us_per_task": server_us,
            "cpu_us_per_task": worker_us + server_us,
            "report_calls": stats.report_calls,
            "report_calls_per_task": stats.report_calls / n,
            "reports_per_call": stats.reports / stats.report_calls if stats.report_calls else None,
            "registry_round_trips_per_task": stats.registry_round_trips / n,
            "server_commands_per_task": delta.commands / n,
            "evalsha_per_task": delta.per_command.get("evalsha", 0) / n,
        }
    )
    left = framework.pending()
    if left:
        raise AssertionError(f"{left} message(s) left in the broker after the run")
    return figures


def abba(pairs: int) -> Iterator[str]:
    """off, on, on, off, off, on, ...: each arm as often first as second."""
    for i in range(pairs):
        yield from (ARMS if i % 2 == 0 else ARMS[::-1])


# -- scenario 2: memory per registration, with and without a full history ---------------------


def memory(server: Server, n: int, history: int) -> dict[str, Any]:
    server.flush()
    client = redis.Redis.from_url(db_url(server.url, DB_REGISTRY))
    repeat = Repeat(client, PREFIX)
    queue = "lc-memory"
    keys = QueueKeys(PREFIX, queue)
    names = [name_of(i) for i in range(n)]
    start = int(time.time() * 1000) - (history + 3) * HOUR_MS
    before = server.raw().used_memory
    first = register(repeat, queue, n, start)
    counting = Counting()
    Pump(repeat, [queue], counting).run_once(now_ms=first)  # fired once: a live record
    if counting.count != n:
        raise AssertionError(f"fired {counting.count} of {n}")
    fired = server.raw().used_memory
    record_bare = server.memory_usage(keys.record(names[0]))
    began = time.perf_counter()
    sent = fill_histories(repeat, queue, names, first + HOUR_MS, history, full=True)
    fill_s = time.perf_counter() - began
    filled = server.raw().used_memory
    record_full = server.memory_usage(keys.record(names[0])) or 0
    history_key = server.memory_usage(keys.history(names[0])) or 0
    entries = repeat.history(queue, names[0])
    if len(entries) != history:
        raise AssertionError(f"the history holds {len(entries)} entries, not {history}")
    raw = client.lrange(keys.history(names[0]), 0, -1)
    statuses: dict[str, int] = {}
    for entry in entries:
        statuses[entry.status] = statuses.get(entry.status, 0) + 1
    registration = repeat.get(queue, names[0])
    return {
        "bytes_per_registration_no_history": (fired - before) / n,
        "bytes_per_registration_full_history": (filled - before) / n,
        "history_bytes_per_registration": (filled - fired) / n,
        "record_bytes_no_history": record_bare,
        "record_bytes_full_history": record_full,
        "history_key_bytes": history_key,
        "record_plus_history_bytes": record_full + history_key,
        "history_entries": len(entries),
        "history_entry_json_bytes": sum(len(item) for item in raw) / len(raw),
        "history_statuses": statuses,
        "record_encoding": encoding(client, keys.record(names[0])),
        "history_encoding": encoding(client, keys.history(names[0])),
        "reports_sent": sent,
        "reports_per_s": sent / fill_s,
        "last_status": registration.last_status if registration else None,
        "failures": registration.failures if registration else None,
    }


# -- scenario 3: what one report costs, by batch size and history length ---------------------


def report_cost(
    server: Server, registrations: int, occurrences: int, batches: Sequence[int]
) -> dict[str, Any]:
    """Send `occurrences` started + succeeded pairs through `Repeat.report` in calls of each
    batch size, against histories of 50 entries and of 1 (`history_size=1`): client wall
    time and CPU, server CPU and server commands, per report."""
    server.flush()
    client = redis.Redis.from_url(db_url(server.url, DB_REGISTRY))
    repeat = Repeat(client, PREFIX)
    names = [name_of(i) for i in range(registrations)]
    # The floor of any call on this machine: one PING round trip, client wall and CPU.
    began, client_began = time.perf_counter(), time.process_time()
    for _ in range(2000):
        client.ping()
    figures: dict[str, Any] = {
        "ping_wall_us": (time.perf_counter() - began) / 2000 * 1e6,
        "ping_client_cpu_us": (time.process_time() - client_began) / 2000 * 1e6,
    }
    for history_size in (HISTORY_SIZE, 1):
        queue = f"lc-cost-{history_size}"
        slots = HISTORY_SIZE + occurrences * len(batches) // registrations + 2
        start = int(time.time() * 1000) - (slots + 2) * HOUR_MS
        first = register(repeat, queue, registrations, start)
        fill_histories(
            repeat, queue, names, first, history_size, full=False, history_size=history_size
        )
        due = first + history_size * HOUR_MS
        for batch in batches:
            reports: list[Report] = []
            for k in range(occurrences):
                name = names[k % registrations]
                reports += occurrence_reports(queue, name, due + (k // registrations) * HOUR_MS, 0)
            due += (occurrences // registrations + 1) * HOUR_MS
            before, cpu = server.raw(), server_cpu_s(server)
            began, client_began = time.perf_counter(), time.process_time()
            for i in range(0, len(reports), batch):
                repeat.report(reports[i : i + batch], history_size=history_size)
            wall = time.perf_counter() - began
            client_cpu = time.process_time() - client_began
            used = server_cpu_s(server) - cpu
            delta = server.delta(before, server.raw())
            tag = f"h{history_size}_b{batch}"
            figures[f"{tag}_wall_us_per_report"] = wall / len(reports) * 1e6
            figures[f"{tag}_client_cpu_us_per_report"] = client_cpu / len(reports) * 1e6
            figures[f"{tag}_server_cpu_us_per_report"] = used / len(reports) * 1e6
            figures[f"{tag}_server_commands_per_report"] = delta.commands / len(reports)
    return figures


def encoding(client: redis.Redis, key: str) -> str:
    value: Any = client.object("encoding", key)
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the table ---------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


THROUGHPUT_ROWS = [
    ("tasks_per_s", "worker throughput, no-op task (tasks/s) ↑"),
    ("wall_s", "first start → last finish (s) ↓"),
    ("worker_cpu_us_per_task", "worker CPU per task, all its processes (µs) ↓"),
    ("server_cpu_us_per_task", "server CPU per task (µs) ↓"),
    ("cpu_us_per_task", "worker + server CPU per task (µs) ↓; ratio: off / on"),
    ("report_calls_per_task", "`Repeat.report` calls per task ↓"),
    ("reports_per_call", "reports per `Repeat.report` call ↑"),
    ("registry_round_trips_per_task", "worker round trips to the registry per task ↓"),
    ("evalsha_per_task", "server EVALSHA per task (broker's and reporting's) ↓"),
    ("server_commands_per_task", "server commands per task (incl. Lua) ↓"),
    ("settled_after_last_task_ms", "every report applied, after the last task (ms)"),
    ("reports_landed", "occurrences whose `succeeded` is in their history"),
]

MEMORY_ROWS = [
    ("bytes_per_registration_no_history", "used_memory Δ / registration, fired once, no history"),
    ("bytes_per_registration_full_history", "used_memory Δ / registration, full history"),
    ("history_bytes_per_registration", "of which the history and the record's new fields"),
    ("record_bytes_no_history", "MEMORY USAGE of one record, no history"),
    ("record_bytes_full_history", "MEMORY USAGE of one record, after the reports"),
    ("history_key_bytes", "MEMORY USAGE of one history (50 entries)"),
    ("record_plus_history_bytes", "record + history, MEMORY USAGE"),
    ("history_entry_json_bytes", "one history entry, JSON text (mean)"),
]


def render(meta: dict[str, Any], medians: dict[str, Any]) -> str:
    plan = meta["plan"]
    slots = {"celery": plan["slots"], "dramatiq": plan.get("dramatiq_slots", plan["slots"])}
    n_of = {framework: plan["registrations"] * slots[framework] for framework in FRAMEWORKS}
    lines = [
        f"Worker throughput, N no-op occurrences a repetition ({plan['registrations']:,} "
        f"registrations x slots, full histories): Celery {n_of['celery']:,} ("
        f"{slots['celery']} slots), Dramatiq {n_of['dramatiq']:,} ({slots['dramatiq']} slots); "
        f"medians of {plan['pairs']} repetitions per arm:",
        "",
        "| figure | Celery off | Celery on | Celery on/off | Dramatiq off | Dramatiq on "
        "| Dramatiq on/off |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    throughput_medians = medians.get("throughput", {})
    for metric, label in THROUGHPUT_ROWS:
        cells = [label]
        for framework in FRAMEWORKS:
            n = str(n_of[framework])
            off = throughput_medians.get(f"{framework} off", {}).get(n, {}).get(metric)
            on = throughput_medians.get(f"{framework} on", {}).get(n, {}).get(metric)
            ratio = None
            if metric in ("tasks_per_s", "wall_s") and off and on:
                ratio = f"{on / off:.3f}×"  # noqa: RUF001
            elif metric == "cpu_us_per_task" and off and on:
                ratio = f"{off / on:.3f}×"  # noqa: RUF001
            cells += [fmt(off), fmt(on), ratio or ""]
        lines.append("| " + " | ".join(cells) + " |")
    pairs = meta.get("paired_ratios", {})
    if pairs:
        lines += [
            "",
            "Throughput on/off of each pair (a pair: one off and one on repetition, "
            "run one after the other): "
            + "; ".join(
                f"{framework} " + ", ".join(f"{r:.3f}" for r in ratios)
                for framework, ratios in pairs.items()
            )
            + ".",
        ]
    lines += [
        "",
        f"Reporting: Celery, {meta['reporting']['celery']}; Dramatiq, "
        f"{meta['reporting']['dramatiq']}.",
        "",
        f"Memory per registration, N = {plan['memory_n']:,}, the bench's 100-byte template:",
        "",
        "| figure | bytes |",
        "|---|--:|",
    ]
    cost = (
        medians.get("report-cost", {}).get("emq-bridge", {}).get(str(plan["cost_occurrences"]), {})
    )
    if cost:
        lines[-4:-4] = [
            f"One `Repeat.report` call of B reports ({plan['cost_occurrences']:,} occurrences' "
            "started + succeeded, from the bench process), per report:",
            "",
            "| history | B | client wall (µs) | client CPU (µs) | server CPU (µs) "
            "| server commands |",
            "|---|--:|--:|--:|--:|--:|",
            *(
                f"| {size} | {batch} | {fmt(cost.get(f'h{size}_b{batch}_wall_us_per_report'))} "
                f"| {fmt(cost.get(f'h{size}_b{batch}_client_cpu_us_per_report'))} "
                f"| {fmt(cost.get(f'h{size}_b{batch}_server_cpu_us_per_report'))} "
                f"| {fmt(cost.get(f'h{size}_b{batch}_server_commands_per_report'))} |"
                for size in (HISTORY_SIZE, 1)
                for batch in plan["cost_batches"]
            ),
            "",
            f"A PING round trip from the bench process, for scale: "
            f"{fmt(cost.get('ping_wall_us'))} µs wall, {fmt(cost.get('ping_client_cpu_us'))} µs "
            "client CPU.",
            "",
        ]
    mem = medians.get("memory", {}).get("emq-bridge", {}).get(str(plan["memory_n"]), {})
    for metric, label in MEMORY_ROWS:
        lines.append(f"| {label} | {fmt(mem.get(metric), 4)} |")
    if mem:
        lines += [
            "",
            f"History entries by status: {mem.get('history_statuses')}; record encoding "
            f"{mem.get('record_encoding')}, history encoding {mem.get('history_encoding')}.",
        ]
    return "\n".join(lines) + "\n"


# -- the run -----------------------------------------------------------------------------------


def portable_command(argv: list[str]) -> str:
    return " ".join(["python -m bench.lifecycle", *(portable_arg(arg) for arg in argv)])


def run(plan: Plan, results: Results, server: Server) -> None:
    frameworks = {name: Framework(name, server, plan.of(name)) for name in plan.frameworks}
    for name, framework in frameworks.items():
        step(results, "set-up", name, framework.plan.n, framework.set_up)
    # A first, unrecorded repetition of each: scripts compiled, worker imports cached.
    for name, framework in frameworks.items():
        measured = framework.plan
        warm = replace(measured, slots=1)
        framework.plan = warm
        for arm in ARMS:
            step(
                results,
                "warm-up",
                f"{name} {arm}",
                warm.n,
                partial(throughput, framework, arm == "on"),
            )
        framework.plan = measured
    for arm in abba(plan.pairs):
        for name, framework in frameworks.items():
            step(
                results,
                "throughput",
                f"{name} {arm}",
                framework.plan.n,
                partial(throughput, framework, arm == "on"),
            )
    step(
        results,
        "report-cost",
        "emq-bridge",
        plan.cost_occurrences,
        partial(report_cost, server, plan.registrations, plan.cost_occurrences, plan.cost_batches),
    )
    step(
        results,
        "memory",
        "emq-bridge",
        plan.memory_n,
        partial(memory, server, plan.memory_n, plan.history),
    )


def paired_ratios(results: Results, plan: Plan) -> dict[str, list[float]]:
    out = {}
    for name in plan.frameworks:
        runs = results.runs.get("throughput", {})
        n = str(plan.of(name).n)
        off = runs.get(f"{name} off", {}).get(n, {}).get("tasks_per_s", [])
        on = runs.get(f"{name} on", {}).get(n, {}).get("tasks_per_s", [])
        out[name] = [b / a for a, b in zip(off, on, strict=False) if a and b]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lifecycle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (N = 1,000, 1 pair)")
    parser.add_argument("--out", type=Path, metavar="PATH", help="write PATH.json and PATH.md")
    parser.add_argument(
        "--pairs", type=int, metavar="N", help="repetitions of each arm (default 3; 1 quick)"
    )
    parser.add_argument(
        "--framework",
        action="append",
        choices=FRAMEWORKS,
        help="measure this framework's throughput only (repeatable; default both)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures here")
    parser.add_argument("--table", type=Path, metavar="PATH", help="write the table here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("celery").setLevel(logging.ERROR)

    plan = plan_for(args.quick)
    if args.pairs is not None:
        if args.pairs < 1:
            parser.error("--pairs must be at least 1")
        plan = replace(plan, pairs=args.pairs)
    if args.framework:
        plan = replace(plan, frameworks=tuple(dict.fromkeys(args.framework)))
    started = time.time()
    out = args.out
    if out is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        out = RESULTS_DIR / (f"{stamp}-lifecycle" + ("-quick" if args.quick else ""))
    figures_path, table_path = output_paths(out, args.json, args.table, started, args.quick, False)
    with EmbeddedServer() as embedded:
        server = Server(embedded.url)
        server.calibrate()
        meta = {
            "command": portable_command(argv if argv is not None else sys.argv[1:]),
            "quick": args.quick,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
            "server": describe_server(embedded.binary, server.name_and_version()),
            "machine": machine(),
            "reporting": REPORTING,
            "workers": {name: " ".join(worker_command(name, plan)[1:]) for name in FRAMEWORKS},
            "plan": {**vars(plan), "n": {name: plan.of(name).n for name in FRAMEWORKS}},
        }
        results = Results(figures_path, meta)
        log(f"server {meta['server']} at {embedded.url}")
        run(plan, results, server)
        results.meta["paired_ratios"] = paired_ratios(results, plan)
        results.meta["seconds"] = round(time.time() - started, 1)
        results.meta["load_average_at_end"] = os.getloadavg()
        results.save()
    publish(render(results.meta, results.medians()), table_path, figures_path, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
