"""The installed `emq-bridge` console script and `python -m emq_bridge`, as real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emq_bridge import Repeat

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def script() -> str:
    path = Path(sys.executable).parent / "emq-bridge"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `pip install -e .` so the console script is installed")
    return str(path)


def test_the_console_script_lists_schedules_as_json(
    script: str, redis_url: str, prefix: str, repeat: Repeat
) -> None:
    repeat.register("reports", "digest", every="15m", template={"task": "app.digest"})
    done = subprocess.run(
        [script, "--redis-url", redis_url, "--prefix", prefix, "list", "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [(r["queue"], r["name"], r["template"]["task"]) for r in listed] == [
        ("reports", "digest", "app.digest")
    ]


def test_python_dash_m_runs_the_same_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "emq_bridge", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Commands:" in done.stdout
    assert "pump" in done.stdout


def test_the_console_script_exits_3_on_an_unreachable_server_without_printing_the_password(
    script: str,
) -> None:
    done = subprocess.run(
        [script, "--redis-url", "redis://ops:t0p-secret@127.0.0.1:1/0", "list"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 3
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "t0p-secret" not in done.stderr


def test_a_pump_process_fires_into_a_list_and_stops_cleanly_on_sigterm(
    script: str, redis_url: str, prefix: str, repeat: Repeat
) -> None:
    repeat.register("ticks", "beat", every="200ms", template={"task": "beat"})
    out_key = f"{prefix}:out"
    process = subprocess.Popen(
        [
            script,
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "pump",
            "ticks",
            "--list-key",
            out_key,
            "--max-sleep",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while (
            repeat.client.llen(out_key) < 2
            and time.monotonic() < deadline
            and process.poll() is None
        ):
            time.sleep(0.1)
        assert repeat.client.llen(out_key) >= 2, "the pump fired nothing"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "pump stopped" in stderr
    message = json.loads(repeat.client.lindex(out_key, 0))
    assert (message["queue"], message["name"], message["template"]) == (
        "ticks",
        "beat",
        {"task": "beat"},
    )
