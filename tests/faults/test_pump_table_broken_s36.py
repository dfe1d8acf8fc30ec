"""A pump table of another type in one queue no longer stops every listing (found by a probe
of damaged registries, session 36).

`SET emq:{qa}:pumps x`: `list`, `show` and the web view's schedules read the pump tables
only to flag schedules no live pump serves, and one WRONGTYPE failed them for every queue
(exit 3, "Redis refused"; 503). That table now reads as no pump, logged; `emq-bridge pumps`
and `health`, which are about pumps, still fail on it, naming the key. A real server.
"""

from __future__ import annotations

import subprocess
import sys

import redis

from emq_bridge import Repeat


def test_a_broken_pump_table_flags_rather_than_stops_a_listing(
    client: redis.Redis, redis_url: str, prefix: str
) -> None:
    repeat = Repeat(client, prefix)
    for queue in ("qa", "qb"):
        repeat.upsert(queue, "job", every="1h", template={"task": "t"})
    client.set(repeat.keys("qa").pumps, "x")
    base = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *argv], capture_output=True, text=True, timeout=60)

    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    assert "qa" in listed.stdout and "qb" in listed.stdout
    assert "its pump table cannot be read, taken as no pump" in listed.stderr
    shown = cli("show", "qb", "job")
    assert shown.returncode == 0, shown.stderr
    pumps = cli("pumps")
    assert pumps.returncode == 3 and "WRONGTYPE" in pumps.stderr, pumps.stderr
