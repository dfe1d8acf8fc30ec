"""`emq-bridge export -o FILE` replaces the file whole or leaves it as it was (probe:
interrupted operations, session 31).

Before, it wrote the file in place: an export that met a full disk exited 1, as documented,
but had already cut the previous export short, an invalid schedule file. Now it writes a new
file beside it and renames it over the old one. The full disk is the process's file size
limit here (`RLIMIT_FSIZE`, with SIGXFSZ ignored so that the write fails with EFBIG).
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import redis

from emq_bridge import Repeat

QUEUE = "exq"
LIMIT_BYTES = 4096


def template(args: list[str] | None = None) -> dict[str, object]:
    """A whole template (a file declares all four parts: a partial one is left out)."""
    return {"task": "t", "args": args or [], "kwargs": {}, "options": {}}


def _limited() -> None:  # in the child, before exec
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def export(
    redis_url: str, prefix: str, output: Path, limited: bool
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    return subprocess.run(
        [*argv, "export", "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited if limited else None,
        check=False,
    )


def test_an_export_that_cannot_be_written_leaves_the_previous_one_whole(
    client: redis.Redis, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    repeat = Repeat(client, prefix)
    repeat.register(QUEUE, "small", every="1h", template=template())
    output = tmp_path / "schedules.toml"
    assert export(redis_url, prefix, output, limited=False).returncode == 0
    os.chmod(output, 0o640)
    previous = output.read_bytes()
    assert b'name = "small"' in previous
    for i in range(200):  # an export far past the limit
        repeat.register(QUEUE, f"job-{i:03}", every="1h", template=template(["x" * 40]))
    done = export(redis_url, prefix, output, limited=True)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"Error: cannot write {output}"), (
        done.stderr
    )
    assert output.read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir()] == ["schedules.toml"]  # no temporary left
    # Written in full: the new export, with the file's own mode kept.
    assert export(redis_url, prefix, output, limited=False).returncode == 0
    assert b'name = "job-199"' in output.read_bytes()
    assert stat.S_IMODE(output.stat().st_mode) == 0o640
