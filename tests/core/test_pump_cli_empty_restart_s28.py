"""`emq-bridge pump --file ...` (the standalone pump, which syncs its schedule files and its
app's declarations at start) gets them back when its registry Redis restarts empty, as a
beat and a Dramatiq worker do: it rode the outage out, then had nothing to send until it was
restarted (its `RegistryWatch` was only the adapters')."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
from processes import EMQ_BRIDGE, stop, wait_until

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

FILE = """
queue = "reports"
source = "ops"

[[schedule]]
name = "every-second"
task = "app.tick"
every = "1s"
"""


def test_the_standalone_pump_syncs_its_file_again_when_the_registry_restarts_empty(
    tmp_path: Path, prefix: str
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    data = tmp_path / "registry"
    data.mkdir()
    registry = EmbeddedServer(directory=str(data)).start()
    port = registry.port
    log = tmp_path / "pump.log"
    with log.open("wb") as out:
        pump = subprocess.Popen(
            [
                *(EMQ_BRIDGE, "--redis-url", registry.url, "--prefix", prefix, "pump", "reports"),
                *("--file", str(path), "--list-key", "out", "--max-sleep", "0.5"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        first = redis.Redis.from_url(registry.url)
        wait_until(lambda: first.llen("out") > 0, 30, "the first push", then=log.read_text)
        first.close()
        registry.stop()  # no persistence: what it held is gone
        time.sleep(1.5)
        registry = EmbeddedServer(port=port, directory=str(data)).start()
        client = redis.Redis.from_url(registry.url)
        repeat = Repeat(client, prefix)

        def back_and_pushing() -> bool:
            assert pump.poll() is None, log.read_text()[-3000:]
            names = {r.name for r in repeat.list("reports")}
            return "every-second" in names and client.llen("out") > 1

        wait_until(back_and_pushing, 30, "the schedule back, pushed", then=log.read_text)
        client.close()
    finally:
        stop(pump)
        registry.stop()
    text = log.read_text()
    assert "the registry lost 1 schedule(s) of ops (Redis restarted empty, or evicted" in text, (
        text[-3000:]
    )
