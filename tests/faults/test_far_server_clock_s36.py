"""A server whose clock reads past 1e14 ms (5138-11-16) still serves pumps and `health`
(found by a probe of the calendar's edges, session 36).

Instants are documented from 1970 to the end of 9999. `scan.lua` wrote the server's `TIME`
with Lua's `tostring`, which gives 14 significant digits: `1.0000000000686e+14` from
5138-11-16T09:46:40Z on, and the pump's tick and `health` failed on it (`ValueError`, a
traceback, exit 1). The server runs under libfaketime, as a server whose clock reads that
far would; its `TIME` is what the pump and `health` go by.
"""

from __future__ import annotations

import glob
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
from needs import require

from emq_bridge import Pump, Repeat
from emq_bridge.embedded import EmbeddedServer, find_server_binary
from emq_bridge.testing import RecordingDispatcher

FAR = "@9999-06-01 00:00:00"  # libfaketime's absolute start; the clock then runs on
FAR_MS = int(datetime(9999, 6, 1, tzinfo=timezone.utc).timestamp() * 1000)


@pytest.fixture
def far_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    require(found, "libfaketime (Debian's faketime package) is not installed")
    wrapper = tmp_path / "far-valkey-server"
    # The library preloaded into the server itself (`exec`), not the `faketime` program,
    # which forks it: stopping the program would leave the server running.
    wrapper.write_text(
        f'#!/bin/sh\nLD_PRELOAD={found[0]} FAKETIME="{FAR}" TZ=UTC '
        f'exec {find_server_binary()} "$@"\n'
    )
    wrapper.chmod(0o755)
    with EmbeddedServer(binary=str(wrapper)) as server:
        yield server


def test_a_pump_and_health_on_a_server_clock_past_1e14_ms(far_server: EmbeddedServer) -> None:
    client = redis.Redis.from_url(far_server.url)
    seconds, _ = client.time()
    assert seconds * 1000 >= FAR_MS  # the server's clock is in 9999
    repeat = Repeat(client, "far")
    repeat.upsert("q", "often", every="100ms", template={"task": "t"})
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)
    for _ in range(10):
        pump.step()
        pump.sleep(0.05)
    assert dispatcher.occurrences, "nothing sent"
    due = [o.due_ms for o in dispatcher.occurrences]
    assert len(set(due)) == len(due) and min(due) >= FAR_MS
    command = ["--redis-url", far_server.url, "--prefix", "far", "health", "--queue", "q"]
    done = subprocess.run(
        [sys.executable, "-m", "emq_bridge", *command, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr  # healthy or not (no live pump): an answer
    client.close()
