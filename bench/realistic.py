"""Realistic workloads through the paths users run, side by side on one embedded server.

    python -m bench.realistic --quick   # every scenario at small N, under 3 minutes
    python -m bench.realistic           # the full run (about 12 minutes on 2 cores)

Distinct args/kwargs per registration (the identical template only in rows labelled so);
the Celery path driven as `celery beat -S emq` runs it, beside celery-redbeat; the Dramatiq
path through a worker's `RecurringMiddleware`, beside `Pump.run` and a bare enqueue loop;
boot from a `beat_schedule`, `@recurring` decorators, a TOML file (`emq-bridge sync`) and
prebuilt declarations; memory and where it goes; one pump over 1,000 queues; a sustained
10,000 occurrences/s over 2 pumps; `emq-bridge list --limit 50` at 100,000 schedules.
Every figure is the median of its repetitions (all of them are in the JSON), and the table
of aims is computed from those figures. Output as `python -m bench`: `--out PATH` writes
`PATH.json` and `PATH.md`, else a new pair in `bench/results/`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path

from emq_bridge.embedded import EmbeddedServer

from . import realistic_scenarios as sc
from .common import Server, count_client_traffic
from .output import describe_server, output_paths, portable_command
from .realistic_report import aims, render, sustained_label
from .run import Results, log, machine, publish, step
from .systems import Emq, RedBeat

DEFAULT = "emq drop-in, default"
PIPELINED = "emq drop-in, pipelined"
REDBEAT = "celery-redbeat"
IDENTICAL = " · identical args (secondary)"
REPORT_OFF = "emq drop-in, default, emq_bridge_report=False"


@dataclass
class Plan:
    """How much to run; the full run's sizes are the issue's."""

    celery_sizes: list[int]
    celery_reps: dict[int, int]
    redbeat_reps: dict[int, int]
    secondary_sizes: list[int]  # identical-args rows and the report-off row
    dramatiq_sizes: list[int]
    dramatiq_reps: dict[int, int]
    cap_s: dict[str, float]
    boot_n: int
    boot_reps: int
    declarations_n: int
    memory_n: int
    queues: int = 1000
    per_queue: int = 10
    idle_ticks: int = 9
    wake_attempts: int = 5
    wake_cap_s: float = 8.0
    sustained_rate: int = 10_000
    sustained_s: float = 60.0
    sustained_pumps: int = 2
    # Secondary rows, labelled: (rate, pumps) at lower rates, each for `sustained_low_s`, to
    # tell the lag the pumps keep where this machine's CPUs are not all taken.
    sustained_low: tuple[tuple[int, int], ...] = ((5000, 2), (5000, 1), (2500, 1))
    sustained_low_s: float = 30.0
    list_n: int = 100_000
    list_reps: int = 5
    quick: bool = False


def plan_for(quick: bool) -> Plan:
    if quick:
        return Plan(
            celery_sizes=[2000],
            celery_reps={2000: 1},
            redbeat_reps={2000: 1},
            secondary_sizes=[2000],
            dramatiq_sizes=[2000],
            dramatiq_reps={2000: 1},
            cap_s={"emq": 60, "redbeat": 20},
            boot_n=10_000,
            boot_reps=1,
            declarations_n=100_000,
            memory_n=5000,
            idle_ticks=5,
            wake_attempts=3,
            wake_cap_s=6.0,
            sustained_s=10.0,
            sustained_low=((2500, 1),),
            sustained_low_s=10.0,
            list_reps=3,
            quick=True,
        )
    return Plan(
        celery_sizes=[10_000, 100_000],
        celery_reps={10_000: 3, 100_000: 1},
        redbeat_reps={10_000: 2, 100_000: 1},
        secondary_sizes=[10_000],
        dramatiq_sizes=[10_000, 100_000],
        dramatiq_reps={10_000: 3, 100_000: 1},
        cap_s={"emq": 120, "redbeat": 60},
        boot_n=100_000,
        boot_reps=2,
        declarations_n=1_000_000,
        memory_n=10_000,
    )


def run_celery(plan: Plan, results: Results, server: Server, emq: Emq, redbeat: RedBeat) -> None:
    """Scenario 1: celery beat -S emq (default, pipelined) beside celery-redbeat."""
    cap = plan.cap_s
    for n in plan.celery_sizes:
        server.flush()
        for _ in range(plan.redbeat_reps[n]):
            step(
                results,
                "celery",
                REDBEAT,
                n,
                partial(sc.redbeat_drain, server, redbeat, n, cap["redbeat"]),
            )
        for _ in range(plan.celery_reps[n]):
            for label, pipelined in ((DEFAULT, False), (PIPELINED, True)):
                step(
                    results,
                    "celery",
                    label,
                    n,
                    partial(sc.celery_drop_in, server, emq, n, cap["emq"], pipelined=pipelined),
                )
        if n in plan.secondary_sizes:
            step(
                results,
                "celery",
                REPORT_OFF,
                n,
                partial(sc.celery_drop_in, server, emq, n, cap["emq"], report=False),
            )
            step(
                results,
                "celery",
                REDBEAT + IDENTICAL,
                n,
                partial(sc.redbeat_drain, server, redbeat, n, cap["redbeat"], identical=True),
            )
            for label, pipelined in ((DEFAULT, False), (PIPELINED, True)):
                step(
                    results,
                    "celery",
                    label + IDENTICAL,
                    n,
                    partial(
                        sc.celery_drop_in,
                        server,
                        emq,
                        n,
                        cap["emq"],
                        identical=True,
                        pipelined=pipelined,
                    ),
                )
    redbeat._close()


# The Dramatiq dispatcher choices measured: the default (automatic: pipelined on a plain
# RedisBroker), the pipelined dispatcher asked for, and the opt-out.
DRAMATIQ_PATHS = {None: "default", True: "pipelined", False: "one enqueue per message"}


def run_dramatiq(plan: Plan, results: Results, server: Server, emq: Emq) -> None:
    """Scenario 2: the middleware's pump thread and Pump.run, beside a bare enqueue loop."""
    cap = plan.cap_s["emq"]
    for n in plan.dramatiq_sizes:
        server.flush()
        sc.dramatiq_sync(emq.repeat, n)
        for _ in range(plan.dramatiq_reps[n]):
            step(results, "dramatiq", "bare enqueue loop", n, partial(sc.enqueue_loop, server, n))
            for job, where in (("dramatiq-worker", "RecurringMiddleware"), ("pump", "Pump.run")):
                for pipelined in (None, True, False):
                    label = f"{where}, {DRAMATIQ_PATHS[pipelined]}"
                    step(
                        results,
                        "dramatiq",
                        label,
                        n,
                        partial(sc.dramatiq_drain, server, emq, n, cap, job, pipelined),
                    )
        if n in plan.secondary_sizes:
            step(
                results,
                "dramatiq",
                "RecurringMiddleware, default, report=False",
                n,
                partial(sc.dramatiq_drain, server, emq, n, cap, "dramatiq-worker", None, False),
            )
            sc.dramatiq_sync(emq.repeat, n, identical=True)
            for pipelined in (None, False):
                label = f"RecurringMiddleware, {DRAMATIQ_PATHS[pipelined]}"
                step(
                    results,
                    "dramatiq",
                    label + IDENTICAL,
                    n,
                    partial(sc.dramatiq_drain, server, emq, n, cap, "dramatiq-worker", pipelined),
                )


def run_boot(plan: Plan, results: Results, server: Server) -> None:
    """Scenario 3: boot and unchanged restart, the ways users declare schedules."""
    n = plan.boot_n
    for _ in range(plan.boot_reps):
        step(
            results,
            "boot",
            "beat_schedule (RepeatScheduler)",
            n,
            partial(sc.boot_app, server, n, False),
        )
    step(results, "boot", "@recurring (RepeatScheduler)", n, partial(sc.boot_app, server, n, True))
    step(results, "boot", "TOML file (emq-bridge sync)", n, partial(sc.boot_toml, server, n))
    step(
        results,
        "boot",
        "the same file as JSON (emq-bridge sync) · secondary",
        n,
        partial(sc.boot_toml, server, n, True),
    )
    step(
        results,
        "boot",
        "sync() of prebuilt declarations",
        plan.declarations_n,
        partial(sc.boot_declarations, server, plan.declarations_n),
    )
    step(
        results,
        "boot",
        "sync(stamp=True) of prebuilt declarations · secondary",
        plan.declarations_n,
        partial(sc.boot_declarations, server, plan.declarations_n, True),
    )


def run_rest(plan: Plan, results: Results, server: Server, emq: Emq) -> None:
    """Scenarios 4 to 7: memory, many queues, the sustained rate, list."""
    n = plan.memory_n
    step(results, "memory", "emq-bridge", n, partial(sc.memory_emq, server, emq.repeat, n))
    step(results, "memory", "celery-redbeat", n, partial(sc.memory_redbeat, server, n))
    step(
        results,
        "memory",
        "emq-bridge" + IDENTICAL,
        n,
        partial(sc.memory_emq, server, emq.repeat, n, True),
    )

    server.flush()
    queues = sc.many_queues_sync(emq.repeat, plan.queues, plan.per_queue)
    total = plan.queues * plan.per_queue
    step(
        results,
        "many-queues",
        "idle tick",
        total,
        partial(sc.idle_tick_many, server, emq.repeat, queues, plan.idle_ticks),
    )
    step(
        results,
        "many-queues",
        "wake-up",
        total,
        partial(sc.wake_up, server, emq.repeat, queues, plan.wake_attempts, plan.wake_cap_s),
    )

    step(
        results,
        "sustained",
        "2 pumps, pipelined Celery",
        plan.sustained_rate,
        partial(
            sc.sustained,
            server,
            emq.repeat,
            plan.sustained_rate,
            plan.sustained_s,
            plan.sustained_pumps,
        ),
    )
    for rate, pumps in plan.sustained_low:
        step(
            results,
            "sustained",
            sustained_label(rate, pumps),
            rate,
            partial(sc.sustained, server, emq.repeat, rate, plan.sustained_low_s, pumps),
        )

    server.flush()
    step(
        results,
        "list",
        "emq-bridge list --limit 50",
        plan.list_n,
        partial(sc.list_page, server, emq.repeat, plan.list_n, plan.list_reps),
    )


def sentry_version() -> str:
    try:
        return metadata.version("sentry-sdk")
    except metadata.PackageNotFoundError:
        return "not installed"


def warm(server: Server, emq: Emq) -> None:
    """One-time server costs (scripts compiled, databases created) before any figure."""
    sc.dramatiq_sync(emq.repeat, 10)
    emq.idle_tick()
    server.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.realistic",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="every scenario at small N")
    parser.add_argument("--out", type=Path, metavar="PATH", help="write PATH.json and PATH.md")
    parser.add_argument(
        "--only",
        default="celery,dramatiq,boot,rest",
        help="scenario groups to run (celery, dramatiq, boot, rest), comma-separated",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("celery").setLevel(logging.ERROR)
    logging.getLogger("emq_bridge").setLevel(logging.ERROR)  # sync plans: a line per schedule

    plan = plan_for(args.quick)
    groups = {g.strip() for g in args.only.split(",") if g.strip()}
    started = time.time()
    stem = args.out
    if stem is None:
        default = output_paths(None, None, None, started, args.quick, False)[0]
        stem = default.with_name(default.stem + "-realistic")
    figures_path, table_path = output_paths(stem, None, None, started, args.quick, False)
    count_client_traffic()
    with EmbeddedServer() as embedded:
        server = Server(embedded.url)
        server.calibrate()
        argv_used = argv if argv is not None else sys.argv[1:]
        meta = {
            "command": portable_command(argv_used).replace("-m bench", "-m bench.realistic", 1),
            "quick": args.quick,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
            "server": describe_server(embedded.binary, server.name_and_version()),
            "machine": machine(),
            # Installed, sentry-sdk makes RepeatScheduler read every beat entry for its monitors.
            "sentry-sdk": sentry_version(),
            "plan": {k: v for k, v in vars(plan).items()},
        }
        results = Results(figures_path, meta)
        log(f"server {meta['server']} at {embedded.url}")
        emq = Emq(embedded.url)
        redbeat = RedBeat(embedded.url)
        try:
            warm(server, emq)
            if "celery" in groups:
                run_celery(plan, results, server, emq, redbeat)
            if "dramatiq" in groups:
                run_dramatiq(plan, results, server, emq)
            if "boot" in groups:
                run_boot(plan, results, server)
            if "rest" in groups:
                run_rest(plan, results, server, emq)
        finally:
            emq.close()
            redbeat.close()
        results.meta["seconds"] = round(time.time() - started, 1)
        results.meta["aims"] = [
            {**vars(aim), "status": aim.status()} for aim in aims(results.medians(), plan.quick)
        ]
        results.save()
    publish(render(results.meta, results.medians()), table_path, figures_path, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
