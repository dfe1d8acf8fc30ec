"""A real Celery worker whose wall clock is stepped 1 h ahead (an NTP step) while an
occurrence runs reports the run's true duration (probe: clocks).

A prefork worker runs with a `sitecustomize` that shifts its `time.time` by the number of
seconds in a file, re-read every 0.2 s (`time.monotonic` is left alone, as on a real host;
its pool process inherits it); an `emq-bridge pump --celery` on the true clock sends the
occurrence. The test writes 3600 in the file a second into a 3 s run. Before, the history
said the run lasted an hour (both ends were `time.time()`) and that it finished an hour from
now; now its end is its start plus the time elapsed on the monotonic clock
(docs/lifecycle.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import skewed_clock
from processes import wait_until
from quiet import quiet_offset

from emq_bridge import Repeat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RUN_S = 3.0
STEP_S = 3600

SKEW = skewed_clock.STEPPED

APP = textwrap.dedent("""
    import json, os, time

    import redis
    from celery import Celery

    import emq_bridge.celery  # its signal receivers report what the worker runs

    env = os.environ
    app = Celery("csapp", broker=env["CS_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["CS_BROKER"],
        emq_bridge_prefix=env["CS_PREFIX"],
        emq_bridge_heartbeat_s=0.5,
        task_default_queue=env["CS_QUEUE"],
        beat_max_loop_interval=0.5,
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        beat_schedule={  # triggered only: its hourly slot is far from now
            "stepped": {"task": "cs.stepped", "schedule": 3600.0, "offset": env["CS_OFFSET"]},
        },
    )
    notes = redis.Redis.from_url(env["CS_BROKER"])


    @app.task(name="cs.stepped")
    def stepped():
        began = time.time()
        notes.rpush(env["CS_PREFIX"] + ":notes", json.dumps({"began": began}))
        time.sleep(float(env["CS_RUN_S"]))
        notes.rpush(env["CS_PREFIX"] + ":notes", json.dumps({"ended": time.time()}))
""")


def _notes(client: redis.Redis, prefix: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for raw in client.lrange(f"{prefix}:notes", 0, -1):
        found.update(json.loads(raw))
    return found


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[tuple[Path, Path, Path]]:
    """A prefork worker (1 pool process) whose wall clock is read from the offset file, and
    a pump on the true clock, on the test server; yields the offset file and both logs."""
    (tmp_path / "skew").mkdir()
    (tmp_path / "skew" / "sitecustomize.py").write_text(SKEW)
    (tmp_path / "csapp.py").write_text(APP)
    offset = tmp_path / "offset"
    offset.write_text("0")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
        CS_BROKER=redis_url,
        CS_PREFIX=prefix,
        CS_QUEUE=f"{prefix}-q",
        CS_OFFSET=quiet_offset(),
        CS_RUN_S=str(RUN_S),
    )
    skewed = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "skew"), env["PYTHONPATH"]]),
        "CLOCK_OFFSET_FILE": str(offset),
    }
    worker_argv = [sys.executable, "-m", "celery", "-A", "csapp", "worker", "-P", "prefork"]
    worker_argv += ["-c", "1", "-Q", f"{prefix}-q", "-l", "info"]
    worker_argv += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    pump_argv = [sys.executable, "-m", "emq_bridge", "pump", "--celery", "csapp"]
    processes = []
    logs = (tmp_path / "worker.log", tmp_path / "pump.log")
    try:
        for argv, environ, log in ((worker_argv, skewed, logs[0]), (pump_argv, env, logs[1])):
            with log.open("wb") as out:
                processes.append(
                    subprocess.Popen(
                        argv,
                        cwd=tmp_path,
                        env=environ,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        yield offset, *logs
    finally:
        for process in processes:
            _stop(process)
        with redis.Redis.from_url(redis_url) as client:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)


def test_a_run_whose_worker_clock_is_stepped_an_hour_ahead_lasts_its_seconds(
    stack: tuple[Path, Path, Path], client: redis.Redis, prefix: str
) -> None:
    offset, worker_log, pump_log = stack
    repeat = Repeat(client, prefix)
    queue = f"{prefix}-q"

    def logs() -> str:
        tails = (log.read_text(errors="replace")[-3000:] for log in (worker_log, pump_log))
        return "\n".join([f"history: {repeat.history(queue, 'stepped')}", *tails])

    def ready() -> bool:
        return " ready." in worker_log.read_text(errors="replace")

    wait_until(ready, 60, "the worker ready", then=logs)
    wait_until(lambda: repeat.get(queue, "stepped"), 60, "the schedule synced", then=logs)
    repeat.trigger(queue, "stepped")
    wait_until(lambda: "began" in _notes(client, prefix), 60, "the run's start", then=logs)
    time.sleep(1.0)
    offset.write_text(str(STEP_S))  # NTP steps the worker's clock, mid-run

    def ended() -> bool:
        return any(e.status == "succeeded" for e in repeat.history(queue, "stepped"))

    wait_until(ended, 30, "the run's end in the history", then=logs)
    seen = _notes(client, prefix)
    assert seen["ended"] - seen["began"] > STEP_S, seen  # the step did reach the worker
    (entry,) = repeat.history(queue, "stepped")
    assert entry.duration_ms is not None
    assert RUN_S * 1000 - 100 <= entry.duration_ms <= RUN_S * 1000 + 5_000, entry
    # Finished when it did, not an hour from now (`show`: "last ok in 59 min").
    record = repeat.get(queue, "stepped")
    assert record is not None and record.last_success_ms == entry.finished_ms
    assert entry.finished_ms is not None and entry.finished_ms <= repeat.server_time_ms()
