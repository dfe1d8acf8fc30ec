"""An unreachable Sentinel is one short line (exit 3): the address of each sentinel tried and
why, not redis-py's repr of each sentinel's client (about 1,200 characters of connection
options a line)."""

from __future__ import annotations

import socket
import subprocess
import sys


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_unreachable_sentinels_are_named_by_address() -> None:
    first, second = _closed_port(), _closed_port()
    url = f"redis+sentinel://:pw-Q9@127.0.0.1:{first},127.0.0.1:{second}/mymaster"
    done = subprocess.run(
        [sys.executable, "-m", "emq_bridge", "--redis-url", url, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert f"sentinel 127.0.0.1:{first} - " in line and f"sentinel 127.0.0.1:{second} - " in line
    assert "Connection refused" in line
    assert "redis.client.Redis" not in line and "pw-Q9" not in line
    assert len(line) < 400, line
