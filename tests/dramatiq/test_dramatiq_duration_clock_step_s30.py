"""A real Dramatiq worker whose wall clock is stepped 1 h ahead (an NTP step) while an
occurrence runs reports the run's true duration (probe: clocks).

The worker runs with a `sitecustomize` that shifts its `time.time` by the number of seconds
in a file, re-read every 0.2 s (`time.monotonic` is left alone, as on a real host); the
test writes 3600 there a second into a 3 s run. Before, the history said the run lasted an
hour (both ends were `time.time()`) and that it finished an hour from now; now its end is
its start plus the time elapsed on the monotonic clock (docs/lifecycle.md).
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

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, recurring

    env = os.environ
    broker = RedisBroker(url=env["CS_BROKER"], namespace=env["CS_NAMESPACE"])
    broker.add_middleware(
        RecurringMiddleware(prefix=env["CS_PREFIX"], max_sleep_s=0.5, heartbeat_s=0.5)
    )
    dramatiq.set_broker(broker)
    notes = redis.Redis.from_url(env["CS_BROKER"])


    @recurring(every="1h", offset=env["CS_OFFSET"])  # triggered only
    @dramatiq.actor(queue_name=env["CS_QUEUE"])
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


@pytest.fixture
def worker(
    tmp_path: Path, redis_url: str, prefix: str
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """A `dramatiq` worker (1 process, 1 thread) on the test server, its wall clock read
    from the offset file; yields it, the offset file and its log."""
    (tmp_path / "skew").mkdir()
    (tmp_path / "skew" / "sitecustomize.py").write_text(SKEW)
    (tmp_path / "cs_app.py").write_text(APP)
    offset = tmp_path / "offset"
    offset.write_text("0")
    log = tmp_path / "worker.log"
    path = [str(tmp_path / "skew"), str(tmp_path), os.environ.get("PYTHONPATH", "")]
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, path)),
        CLOCK_OFFSET_FILE=str(offset),
        CS_BROKER=redis_url,
        CS_NAMESPACE=f"ns{prefix}",
        CS_PREFIX=prefix,
        CS_QUEUE=f"{prefix}-q",
        CS_OFFSET=quiet_offset(),
        CS_RUN_S=str(RUN_S),
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "dramatiq", "cs_app", "--path", str(tmp_path)),
                *("--processes", "1", "--threads", "1"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, offset, log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with redis.Redis.from_url(redis_url) as client:
            keys = list(client.scan_iter(match=f"ns{prefix}:*", count=1000))
            keys += list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)


def test_a_run_whose_worker_clock_is_stepped_an_hour_ahead_lasts_its_seconds(
    worker: tuple[subprocess.Popen[bytes], Path, Path], client: redis.Redis, prefix: str
) -> None:
    process, offset, log = worker
    repeat = Repeat(client, prefix)
    queue = f"{prefix}-q"

    def worker_log() -> str:
        return log.read_text(errors="replace")[-3000:]

    wait_until(lambda: repeat.get(queue, "stepped"), 60, "the schedule synced", then=worker_log)
    repeat.trigger(queue, "stepped")
    wait_until(lambda: "began" in _notes(client, prefix), 60, "the run's start", then=worker_log)
    time.sleep(1.0)
    offset.write_text(str(STEP_S))  # NTP steps the worker's clock, mid-run

    def ended() -> bool:
        return any(e.status == "succeeded" for e in repeat.history(queue, "stepped"))

    wait_until(ended, 30, "the run's end in the history", then=worker_log)
    assert process.poll() is None, worker_log()
    seen = _notes(client, prefix)
    assert seen["ended"] - seen["began"] > STEP_S, seen  # the step did reach the worker
    (entry,) = repeat.history(queue, "stepped")
    assert entry.duration_ms is not None
    assert RUN_S * 1000 - 100 <= entry.duration_ms <= RUN_S * 1000 + 5_000, entry
    # Finished when it did, not an hour from now (`show`: "last ok in 59 min").
    record = repeat.get(queue, "stepped")
    assert record is not None and record.last_success_ms == entry.finished_ms
    assert entry.finished_ms is not None and entry.finished_ms <= repeat.server_time_ms()
