"""`emq-bridge pump --metrics-port N`: a real pump process scraped over HTTP while it runs."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.definition import define

from .scrape import free_port, sample, scrape, wait_for

SCHEDULES = 1000


@pytest.fixture(scope="module")
def script() -> str:
    return str(Path(sys.executable).parent / "emq-bridge")


def test_a_scrape_during_a_1000_schedule_run_counts_every_dispatch_and_registration(
    script: str,
    redis_url: str,
    prefix: str,
    repeat: Repeat,
    client: redis.Redis,
    tmp_path: Path,
) -> None:
    definition = define(every="1s", template={"task": "app.tick"})
    repeat.upsert_many([("mq", f"s{i:04d}", definition) for i in range(SCHEDULES)])
    repeat.pause("mq", "s0000")
    port = free_port()
    out_key = f"{prefix}:out"
    argv = [script, "--redis-url", redis_url, "--prefix", prefix, "pump", "mq"]
    argv += ["--list-key", out_key, "--metrics-port", str(port), "--max-sleep", "0.2"]
    log = tmp_path / "pump.log"  # a file, not a pipe: a full pipe would block its log lines
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        samples = wait_for(
            lambda: scrape(url),
            # Two ticks at least: on a slow machine one tick can send two rounds of slots.
            lambda s: (
                sample(s, "emq_bridge_occurrences_dispatched_total", queue="mq")
                >= 2 * (SCHEDULES - 1)
                and sample(s, "emq_bridge_pump_ticks_total") >= 2
            ),
            timeout_s=30,
        )
        pushed = client.llen(out_key)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    output = log.read_text(errors="replace")
    assert process.returncode == 0, output[-3000:]
    assert f"metrics on {url}" in output
    dispatched = sample(samples, "emq_bridge_occurrences_dispatched_total", queue="mq")
    assert pushed >= dispatched  # the scrape came first; the pump kept pushing
    assert sample(samples, "emq_bridge_dispatch_lag_seconds_count", queue="mq") == dispatched
    # Each leaves within a minute of its slot even on a loaded machine (within milliseconds
    # on an idle one); a slot a slow first round passed over is counted missed, not sent.
    assert (
        sample(samples, "emq_bridge_dispatch_lag_seconds_bucket", queue="mq", le="60.0")
        == dispatched
    )
    assert sample(samples, "emq_bridge_occurrences_failed_total", queue="mq") == 0
    assert sample(samples, "emq_bridge_registrations", queue="mq", state="active") == SCHEDULES - 1
    assert sample(samples, "emq_bridge_registrations", queue="mq", state="paused") == 1
    assert sample(samples, "emq_bridge_pump_ticks_total") >= 2


# A schedule file the pump would sync: a refused --metrics-port must leave it unsynced
# (session 35, a probe of the built wheel: the pump synced, then said the port was unusable).
SCHEDULE_FILE = 'queue = "mq"\n[[schedule]]\nname = "tick"\ntask = "app.tick"\nevery = "1m"\n'


def test_a_metrics_port_in_use_is_one_line_and_exit_1(
    script: str, redis_url: str, prefix: str, repeat: Repeat, tmp_path: Path
) -> None:
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(SCHEDULE_FILE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                script,
                "--redis-url",
                redis_url,
                "--prefix",
                prefix,
                "pump",
                "mq",
                "--list-key",
                "out",
                "--once",
                "--metrics-port",
                str(port),
                "-f",
                str(schedules),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: cannot serve metrics on 127.0.0.1:{port}: [Errno 98] Address already in use"
    ]
    assert repeat.get("mq", "tick") is None  # refused before anything was written


def test_a_metrics_port_without_prometheus_client_says_what_to_install(
    redis_url: str, prefix: str, repeat: Repeat, tmp_path: Path
) -> None:
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(SCHEDULE_FILE)
    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'prometheus_client':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from emq_bridge.cli import main\n"
        f"main(['--redis-url', {redis_url!r}, '--prefix', {prefix!r}, 'pump', 'mq',\n"
        "      '--list-key', 'out', '--once', '--metrics-port', '0',\n"
        f"      '-f', {str(schedules)!r}])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: --metrics-port needs prometheus_client: pip install 'emq-bridge[metrics]'"
    ]
    assert repeat.get("mq", "tick") is None  # refused before anything was written


def test_an_ipv6_host_is_bracketed_in_the_url_said() -> None:
    from emq_bridge.metrics.serve import MetricsServer

    served = MetricsServer("::1", 9470, None, None)  # type: ignore[arg-type]
    assert served.url == "http://[::1]:9470/metrics"
    assert MetricsServer("127.0.0.1", 9470, None, None).url == "http://127.0.0.1:9470/metrics"  # type: ignore[arg-type]
