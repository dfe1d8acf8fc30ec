"""A real `celery beat -S emq` sends runtime changes when due, not at its next loop wake-up.

Celery's beat service sleeps what `tick()` returns, at most `beat_max_loop_interval`; a team
keeping celery-redbeat's habit of a long loop (here `--max-interval 60`) would otherwise wait
up to a minute for a schedule added at runtime or a manual trigger. Run by the service, the
scheduler's tick sleeps itself and wakes at the registry's change notices, as `emq-bridge pump`
does. A tick called directly (no service) still returns its delay at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from processes import run_cli, stop, wait_until

from emq_bridge.celery import RepeatScheduler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import os

    from celery import Celery

    env = os.environ
    app = Celery("bw_app", broker=env["BW_REDIS"])
    app.conf.update(
        emq_bridge_redis_url=env["BW_REDIS"],
        emq_bridge_prefix=env["BW_PREFIX"],
        task_default_queue=env["BW_QUEUE"],
        beat_schedule={},
        result_backend=None,
        result_expires=None,  # no celery.backend_cleanup entry
        broker_connection_retry_on_startup=True,
    )


    @app.task(name="bw_app.ping")
    def ping():
        pass
""")


@pytest.fixture
def beat(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[tuple[str, Path]]:
    """A `celery beat -S emq --max-interval 60` process on an empty schedule; its queue, log."""
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    (tmp_path / "bw_app.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "BW_REDIS": redis_url,
        "BW_PREFIX": prefix,
        "BW_QUEUE": queue,
    }
    log = tmp_path / "beat.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "bw_app", "beat", "-S", "emq"),
                *("--max-interval", "60", "--pidfile=", f"--schedule={tmp_path / 'beat.db'}"),
                *("-l", "info"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: "emq-bridge beat:" in log.read_text(errors="replace"),
            30,
            "the beat to sync",
            then=lambda: log.read_text(errors="replace"),
        )
        time.sleep(1.0)  # its first tick is done: it sleeps (up to 60 s, nothing is due)
        yield queue, log
    finally:
        stop(process)
        redis.Redis.from_url(redis_url).delete(queue)


def _sent(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["task"] for raw in client.lrange(queue, 0, -1)]


def test_a_schedule_added_at_runtime_is_sent_when_due_not_at_the_next_loop(
    beat: tuple[str, Path], redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue, log = beat
    added = run_cli(
        redis_url, prefix, "add", queue, "every2", "--task", "bw_app.ping", "--every", "2s"
    )
    assert added.returncode == 0, added.stderr
    # Its first slot is at most 2 s off; the beat's loop would wake 60 s after its last tick.
    wait_until(
        lambda: _sent(client, queue), 10, "the runtime schedule's first task", then=log.read_text
    )
    assert _sent(client, queue)[0] == "bw_app.ping"


def test_a_trigger_is_sent_at_once_while_the_beat_sleeps(
    beat: tuple[str, Path], redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue, log = beat
    added = run_cli(
        redis_url, prefix, "add", queue, "hourly", "--task", "bw_app.ping", "--every", "1h"
    )
    assert added.returncode == 0, added.stderr
    time.sleep(1.0)  # woken by the add, the beat sleeps again: nothing is due for up to an hour
    assert _sent(client, queue) == []
    triggered = run_cli(redis_url, prefix, "trigger", queue, "hourly")
    assert triggered.returncode == 0, triggered.stderr
    wait_until(lambda: _sent(client, queue), 10, "the triggered task", then=log.read_text)


def test_a_tick_called_outside_a_beat_service_returns_its_delay_at_once(
    redis_url: str, prefix: str
) -> None:
    app = Celery("bw_direct", broker="memory://")
    app.conf.update(
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        task_default_queue=f"{prefix}-direct",
        beat_schedule={},
        result_backend=None,
        result_expires=None,
    )
    scheduler = RepeatScheduler(app, max_interval=30)
    try:
        began = time.monotonic()
        delay = scheduler.tick()
        assert time.monotonic() - began < 5
        assert delay == 30.0  # nothing due: the loop's longest sleep, for the caller to sleep
    finally:
        scheduler.close()
