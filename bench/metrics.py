"""What Prometheus metrics cost a pump and a reporter.

    python -m bench.metrics            # about 30 s on 2 cores
    python -m bench.metrics --quick    # a smoke run

One embedded server, one run, side by side:

1. **The pump**: N registrations due at once, drained by one `Pump.run_once` into a
   `ListPushDispatcher` (a real Redis list), with no listener but the logging one, and with
   `MetricsEvents` on a fresh registry. Repetitions alternate (off, on, on, off, ...); the
   table gives the medians, occurrences per second and the ratio on/off.
2. **The outcome listener**: `OutcomeMetrics.on_reports` over batches of 500 reports
   (start and success of 250 occurrences), in microseconds per report: what the reporter's
   thread pays per report, never a task.

It prints a Markdown table; nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import redis
from prometheus_client import CollectorRegistry

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.dispatch import ListPushDispatcher
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.lifecycle import report_of
from emq_bridge.metrics import MetricsEvents, OutcomeMetrics
from emq_bridge.testing import ManualClock

T0 = 1_900_000_000_000


def drain_s(url: str, n: int, metrics: bool, run: int) -> tuple[float, float]:
    """Wall and CPU seconds (this process: the pump's side) of one `run_once` sending `n`
    due occurrences."""
    client = redis.Redis.from_url(url)
    repeat = Repeat(client, f"bench{run}")
    definition = define(every="1h", template={"task": "bench.noop"})
    repeat.upsert_many([("q", f"s{i}", definition) for i in range(n)], now_ms=T0)
    clock = ManualClock(repeat.next_runs("q", "s0", 1)[0])  # each one's first slot: all due
    listeners = [MetricsEvents(CollectorRegistry())] if metrics else []
    pump = Pump(
        repeat,
        ["q"],
        ListPushDispatcher(client, f"bench{run}:out"),
        clock=clock,
        listeners=listeners,
    )
    started, cpu = time.perf_counter(), time.process_time()
    tick = pump.run_once()
    elapsed = (time.perf_counter() - started, time.process_time() - cpu)
    assert len(tick.dispatched) == n, len(tick.dispatched)
    client.flushdb()
    client.close()
    return elapsed


def report_us(batches: int) -> float:
    """Microseconds `OutcomeMetrics.on_reports` spends per report."""
    listener = OutcomeMetrics(CollectorRegistry())
    batch = []
    for i in range(250):
        occurrence = {"id": f"o{i}", "queue": "q", "name": f"s{i % 50}", "due_ms": T0}
        batch += [
            report_of("started", occurrence, at_ms=T0 + 10),
            report_of("succeeded", occurrence, at_ms=T0 + 20),
        ]
    listener.on_reports(batch)  # the families and label children, made once
    started = time.perf_counter()
    for _ in range(batches):
        listener.on_reports(batch)
    return (time.perf_counter() - started) / (batches * len(batch)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    logging.getLogger("emq_bridge").setLevel(logging.ERROR)
    n, reps = (2_000, 2) if args.quick else (10_000, 6)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with EmbeddedServer() as server:
        drain_s(server.url, n, True, -1)  # warm-up: scripts loaded, families made
        order = [False, True, True, False] * (reps // 2 or 1)
        for run, metrics in enumerate(order):
            times[metrics].append(drain_s(server.url, n, metrics, run))
    wall = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
    cpu = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
    print(f"| pump drain of {n:,} due occurrences | median wall s | occurrences/s | pump CPU s |")
    print("| --- | --- | --- | --- |")
    for key, label in ((False, "without metrics"), (True, "with `MetricsEvents`")):
        print(f"| {label} | {wall[key]:.3f} | {n / wall[key]:,.0f} | {cpu[key]:.3f} |")
    print(
        f"\nratio with/without: wall {wall[True] / wall[False]:.3f}, pump CPU "
        f"{cpu[True] / cpu[False]:.3f} ({len(order)} drains, alternating)"
    )
    print(
        f"\n`OutcomeMetrics.on_reports`: {report_us(20 if args.quick else 200):.2f} µs per report"
    )


if __name__ == "__main__":
    main()
