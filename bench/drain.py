"""One pump drain of N due registrations with distinct args, no broker: the pump's own cost.

    python -m bench.drain                 # 20,000 registrations, median of 4 drains
    python -m bench.drain --n 100000 --repeat 3

Each repetition registers N hourly schedules (`args=[i]`: one template per registration,
as real schedules have) under a fresh prefix on one embedded server, then drains the first
slot of all of them with `Pump.run_once` and a dispatcher that accepts and drops each
occurrence. It prints occurrences per second (wall), and the server's and this process's
CPU per occurrence (`INFO cpu`, `time.process_time`), medians over the repetitions. A quick
way to see what a change to the claim path costs before the side-by-side bench
(`python -m bench`) measures it against the peers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import redis

from emq_bridge import Pump, Repeat, define
from emq_bridge.embedded import EmbeddedServer

HOUR_MS = 3_600_000
T0 = 1_800_000_000_000  # on the hour grid: the first slot of every registration is T0 + 1 h


class Dropping:
    """Accept every occurrence and send it nowhere."""

    def dispatch(self, occurrence: Any) -> None:
        pass


def server_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(client: redis.Redis, prefix: str, n: int) -> tuple[float, float, float]:
    """Register `n` schedules and drain their first slot; return (occ/s, server µs, client µs)."""
    repeat = Repeat(client, prefix)
    repeat.upsert_many(
        [
            ("q", f"job-{i:07d}", define(every="1h", template={"task": "t", "args": [i]}))
            for i in range(n)
        ],
        now_ms=T0,
    )
    pump = Pump(repeat, ["q"], Dropping())
    due = T0 + HOUR_MS
    began, cpu, server = time.perf_counter(), time.process_time(), server_cpu_s(client)
    sent = 0
    while sent < n:
        sent += len(pump.run_once(now_ms=due).dispatched)
    wall = time.perf_counter() - began
    return (
        n / wall,
        (server_cpu_s(client) - server) * 1e6 / n,
        (time.process_time() - cpu) * 1e6 / n,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain", description=__doc__)
    parser.add_argument("--n", type=int, default=20_000, help="registrations (default 20,000)")
    parser.add_argument("--repeat", type=int, default=4, help="drains (default 4)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.repeat < 1:
        parser.error("--n and --repeat must be at least 1")
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        runs = [drain(client, f"drain{i}", args.n) for i in range(args.repeat)]
    rate, server_us, client_us = (statistics.median(column) for column in zip(*runs, strict=True))
    print(
        f"drain of {args.n:,} registrations (distinct args), median of {args.repeat}: "
        f"{rate:,.0f} occurrences/s, server {server_us:.1f} µs and pump {client_us:.1f} µs "
        "of CPU per occurrence"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
