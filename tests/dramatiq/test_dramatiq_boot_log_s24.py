"""A `dramatiq` worker's first boot on a schedule file of 2,000 schedules fires at once.

Dramatiq's parent process reads its worker processes' log pipes only once every one of them
is ready (or its 30 s `worker_fork_timeout` passed). The boot sync logged one INFO line per
schedule it created (~220 KB here): the worker process blocked writing its own boot log,
was not ready, and nothing fired for ~30 s. The sync now names the first few and counts the
rest (`tests/core/test_log_caps_s24.py`). A real `dramatiq --processes 1` on a fresh
registry.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis
from processes import stop
from quiet import quiet_offset

SCHEDULES = 2000

APP = textwrap.dedent("""
    import os

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware

    env = os.environ
    broker = RedisBroker(url=env["BL_REDIS"], namespace=env["BL_NAMESPACE"])
    broker.add_middleware(
        RecurringMiddleware(
            prefix=env["BL_PREFIX"], schedule_file=env["BL_FILE"], max_sleep_s=0.5
        )
    )
    dramatiq.set_broker(broker)
    results = redis.Redis.from_url(env["BL_REDIS"])


    @dramatiq.actor(queue_name=env["BL_QUEUE"], actor_name="tick")
    def tick():
        results.rpush(env["BL_PREFIX"] + ":ran", 1)
""")


def schedule_file(path: Path, queue: str) -> None:
    """One schedule every second, and 1,999 hourly ones whose slots are far from now."""
    offset = quiet_offset("1h")
    lines = [f'source = "ops-file"\nqueue = "{queue}"\n']
    lines.append('[[schedule]]\nname = "fast"\ntask = "tick"\nevery = "1s"\n')
    lines += [
        f'[[schedule]]\nname = "hourly-{i:04d}"\ntask = "tick"\nevery = "1h"\noffset = "{offset}"\n'
        for i in range(SCHEDULES - 1)
    ]
    path.write_text("\n".join(lines))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_first_boot_on_2000_new_schedules_fires_within_10_seconds(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    token = uuid.uuid4().hex[:8]
    module, queue, namespace = f"bl_app_{token}", f"q{token}", f"bl{token}"
    (tmp_path / f"{module}.py").write_text(APP)
    schedule_file(tmp_path / "schedules.toml", queue)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "BL_REDIS": redis_url,
        "BL_PREFIX": prefix,
        "BL_QUEUE": queue,
        "BL_NAMESPACE": namespace,
        "BL_FILE": str(tmp_path / "schedules.toml"),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        started = time.monotonic()
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "dramatiq", module, "--path", str(tmp_path)),
                *("--processes", "1", "--threads", "2"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: its worker process is killed too
        )
    try:
        while not client.llen(f"{prefix}:ran"):
            elapsed = time.monotonic() - started
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            assert elapsed < 10, (
                f"nothing ran {elapsed:.1f}s after the start:\n"
                + log.read_text(errors="replace")[-3000:]
            )
            time.sleep(0.1)
    finally:
        stop(worker)
        with contextlib.suppress(ProcessLookupError):  # a worker process left behind
            os.killpg(worker.pid, signal.SIGKILL)
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
    output = log.read_text(errors="replace")
    assert f"sync ops-file: {SCHEDULES} created, 0 updated, 0 unchanged, 0 removed" in output
    assert f"sync ops-file: {SCHEDULES - 20} more created (listed at DEBUG)" in output
    assert output.count("sync ops-file: + ") == 20
