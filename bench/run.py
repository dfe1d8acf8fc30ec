"""Run every scenario for emq-bridge and its peers on one embedded server; print one table.

    python -m bench            # the full run (about 15 minutes on 2 cores)
    python -m bench --quick    # a smoke run (about 2 minutes)

Each run writes the plan, the machine, every run of every figure and the medians to
`bench/results/<UTC time>[-quick][-million].json`, and the table it prints to the `.md`
beside it. That folder is git-ignored; `--out PATH` writes `PATH.json` and `PATH.md` instead,
e.g. `--out bench/runs/2026-11-30-final` for a run to commit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from emq_bridge.embedded import EmbeddedServer

from . import baselines, scenarios
from .brokers import adapters_available, emq_dispatcher
from .common import Server, count_client_traffic, median
from .output import describe_server, output_paths, portable_command
from .report import render
from .systems import Emq, Persistent, RedBeat, System

EMQ = "emq-bridge"


@dataclass
class Plan:
    """How much to run: sizes, repetitions and the caps that keep slow peers bounded."""

    sizes: list[int]
    reps: dict[int, int]
    peer_reps: dict[int, int]
    idle_ticks: int
    burst_cap_s: dict[str, float]
    pickup_attempts: int
    pickup_cap_s: float
    lag_rate: int
    lag_seconds: float
    scale_n: int
    scale_procs: list[int]
    baseline_n: int
    pipelined_n: int
    million: bool
    minimal_n: int = 10_000


def plan_for(quick: bool) -> Plan:
    if quick:
        return Plan(
            sizes=[1000],
            reps={1000: 1},
            peer_reps={1000: 1},
            idle_ticks=5,
            burst_cap_s={"emq": 60, "redbeat": 20, "persistent": 5},
            pickup_attempts=3,
            pickup_cap_s=3,
            lag_rate=1000,
            lag_seconds=4,
            scale_n=5000,
            minimal_n=1000,
            scale_procs=[1, 2, 4],
            baseline_n=2000,
            pipelined_n=50_000,
            million=False,
        )
    return Plan(
        sizes=[1000, 10_000, 100_000],
        reps={1000: 3, 10_000: 3, 100_000: 2},
        peer_reps={1000: 3, 10_000: 2, 100_000: 1},
        idle_ticks=9,
        burst_cap_s={"emq": 120, "redbeat": 40, "persistent": 8},
        pickup_attempts=5,
        pickup_cap_s=15,
        lag_rate=1000,
        lag_seconds=8,
        scale_n=100_000,
        scale_procs=[1, 2, 4],
        baseline_n=10_000,
        pipelined_n=200_000,
        million=False,
    )


class Results:
    """Every run's figures, saved after each scenario so a cut-short run keeps what it has."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta
        self.runs: dict[str, dict[str, dict[str, dict[str, list[Any]]]]] = {}

    def add(self, scenario: str, system: str, n: int, figures: dict[str, Any]) -> None:
        slot = self.runs.setdefault(scenario, {}).setdefault(system, {}).setdefault(str(n), {})
        for metric, value in figures.items():
            slot.setdefault(metric, []).append(value)
        self.save()

    def medians(self) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        for scenario, systems in self.runs.items():
            for system, sizes in systems.items():
                for n, metrics in sizes.items():
                    slot = out.setdefault(scenario, {}).setdefault(system, {}).setdefault(n, {})
                    for metric, values in metrics.items():
                        numbers = [
                            v
                            for v in values
                            if isinstance(v, (int, float)) and not isinstance(v, bool)
                        ]
                        if numbers and len(numbers) == len([v for v in values if v is not None]):
                            slot[metric] = median(numbers)
                        elif values and all(isinstance(v, bool) for v in values):
                            slot[metric] = all(values)
                        else:
                            slot[metric] = values[-1] if values else None
                    slot["runs"] = len(next(iter(metrics.values()), []))
        return out

    def save(self) -> None:
        payload = {"meta": self.meta, "medians": self.medians(), "runs": self.runs}
        self.path.write_text(json.dumps(payload, indent=1, default=str))


def machine() -> dict[str, Any]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    memory_kb = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
    cpu = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(memory_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "celery-redbeat": version("celery-redbeat"),
        "dramatiq": version("dramatiq"),
        "redis-py": version("redis"),
        "emq-bridge": version("emq-bridge"),
        "load_average_at_start": os.getloadavg(),
    }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def publish(table: str, table_path: Path, figures_path: Path, started: float) -> None:
    """Write a run's table, print it, and say where it and its figures are."""
    table_path.write_text(table)
    print(table)
    log(f"done in {time.time() - started:.0f}s; figures in {figures_path}, table in {table_path}")


def step(
    results: Results, scenario: str, system: str, n: int, action: Callable[[], dict[str, Any]]
) -> None:
    started = time.monotonic()
    try:
        figures = action()
    except Exception as exc:  # report the failure in the table, keep going with the rest
        logging.getLogger("bench").exception("%s / %s / %d failed", scenario, system, n)
        figures = {"error": f"{type(exc).__name__}: {exc}"}
    results.add(scenario, system, n, figures)
    shown = {
        k: round(v, 3) if isinstance(v, float) else v
        for k, v in figures.items()
        if k != "per_command"
    }
    log(f"{scenario:<9} {system:<16} N={n:<7} {time.monotonic() - started:6.1f}s  {shown}")


def run(plan: Plan, results: Results, server: Server, paths: list[str]) -> None:
    url = server.url
    emq = Emq(url)
    redbeat = RedBeat(url)
    persistent = Persistent(url)
    peers: list[tuple[str, System, float]] = [
        ("celery-redbeat", redbeat, plan.burst_cap_s["redbeat"]),
        ("PersistentScheduler", persistent, plan.burst_cap_s["persistent"]),
    ]
    emq_cap = plan.burst_cap_s["emq"]
    try:
        # One-time server costs (scripts compiled, databases created) go before any figure.
        for store in (emq, redbeat):
            store.sync(10)
            store.idle_tick()
        redbeat._close()
        server.flush()
        for n in plan.sizes:
            for _ in range(plan.reps[n]):
                step(results, "sync", EMQ, n, partial(scenarios.sync_and_memory, server, emq, n))
                step(
                    results,
                    "idle",
                    EMQ,
                    n,
                    partial(scenarios.idle_tick, server, emq, n, plan.idle_ticks),
                )
                for path in paths:
                    emq.path = path
                    step(
                        results,
                        "burst",
                        f"{EMQ}→{path}",
                        n,
                        partial(scenarios.burst, server, emq, n, emq_cap),
                    )
            for label, peer, cap in peers:
                for _ in range(plan.peer_reps[n]):
                    step(
                        results,
                        "sync",
                        label,
                        n,
                        partial(scenarios.sync_and_memory, server, peer, n),
                    )
                    step(
                        results,
                        "idle",
                        label,
                        n,
                        partial(scenarios.idle_tick, server, peer, n, plan.idle_ticks),
                    )
                    step(results, "burst", label, n, partial(scenarios.burst, server, peer, n, cap))
        if plan.million:
            n = 1_000_000
            step(results, "sync", EMQ, n, partial(scenarios.sync_and_memory, server, emq, n))
            step(
                results,
                "idle",
                EMQ,
                n,
                partial(scenarios.idle_tick, server, emq, n, plan.idle_ticks),
            )

        for label, store in ((EMQ, emq), ("celery-redbeat", redbeat)):
            step(
                results,
                "memory-min",
                label,
                plan.minimal_n,
                partial(scenarios.minimal_memory, server, store, plan.minimal_n),
            )

        idle_n = 1000
        server.flush()
        emq.sync(idle_n)
        for path in paths:
            emq.path = path
            step(
                results,
                "pickup",
                f"{EMQ}→{path}",
                idle_n,
                partial(
                    scenarios.pickup, server, emq, idle_n, plan.pickup_attempts, plan.pickup_cap_s
                ),
            )
        server.flush()
        redbeat.sync(idle_n)
        step(
            results,
            "pickup",
            "celery-redbeat",
            idle_n,
            partial(
                scenarios.pickup, server, redbeat, idle_n, plan.pickup_attempts, plan.pickup_cap_s
            ),
        )

        for path in paths:
            emq.path = path
            step(
                results,
                "lag",
                f"{EMQ}→{path}",
                plan.lag_rate,
                partial(scenarios.fire_lag, server, emq, plan.lag_rate, plan.lag_seconds),
            )
        for label, peer, _ in peers:
            step(
                results,
                "lag",
                label,
                plan.lag_rate,
                partial(scenarios.fire_lag, server, peer, plan.lag_rate, plan.lag_seconds),
            )

        server.flush()
        emq.sync(plan.scale_n)
        for path in paths:
            emq.path = path
            for procs in plan.scale_procs:
                step(
                    results,
                    f"scale{procs}",
                    f"{EMQ}→{path}",
                    plan.scale_n,
                    partial(scenarios.scale_out, server, emq, plan.scale_n, procs, emq_cap),
                )

        step(
            results,
            "baseline",
            "emq-bridge pump, no-op dispatcher",
            plan.scale_n,
            partial(baselines.pump_ceiling, server, emq, plan.scale_n),
        )
        server.flush()
        step(
            results,
            "baseline",
            "send_task loop",
            plan.baseline_n,
            partial(baselines.send_task_loop, server, plan.baseline_n),
        )
        step(
            results,
            "baseline",
            "enqueue loop",
            plan.baseline_n,
            partial(baselines.enqueue_loop, server, plan.baseline_n),
        )
        step(
            results,
            "baseline",
            "pipelined LPUSH",
            plan.pipelined_n,
            partial(baselines.pipelined_lpush, server, plan.pipelined_n),
        )
    finally:
        for system in (emq, redbeat, persistent):
            system.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: N=1,000 only, one repetition"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help="write PATH.json and PATH.md (PATH may end in .json or .md) instead of a new pair in "
        "bench/results/",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="write the figures here (overrides --out)"
    )
    parser.add_argument(
        "--table", type=Path, metavar="PATH", help="write the table here (overrides --out)"
    )
    parser.add_argument(
        "--paths",
        default="celery,celery-pipelined,dramatiq,dramatiq-pipelined",
        help="emq-bridge paths to measure",
    )
    parser.add_argument(
        "--million", action="store_true", help="also sync/memory/idle 1,000,000 (emq-bridge)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("celery").setLevel(logging.ERROR)

    plan = plan_for(args.quick)
    plan.million = plan.million or args.million
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    started = time.time()
    figures_path, table_path = output_paths(
        args.out, args.json, args.table, started, args.quick, plan.million
    )
    count_client_traffic()
    with EmbeddedServer() as embedded:
        server = Server(embedded.url)
        server.calibrate()
        dispatchers = {path: emq_dispatcher(path, embedded.url)[1] for path in paths}
        meta = {
            # Committed runs are read on other machines: no absolute paths in what is recorded.
            "command": portable_command(argv if argv is not None else sys.argv[1:]),
            "quick": args.quick,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
            "server": describe_server(embedded.binary, server.name_and_version()),
            "machine": machine(),
            "adapters": adapters_available(),
            "dispatchers": dispatchers,
            "plan": {k: v for k, v in vars(plan).items()},
        }
        results = Results(figures_path, meta)
        log(f"server {meta['server']} at {embedded.url}; dispatchers {dispatchers}")
        run(plan, results, server, paths)
        results.meta["seconds"] = round(time.time() - started, 1)
        results.save()
    publish(render(results.meta, results.medians()), table_path, figures_path, started)
    return 0
