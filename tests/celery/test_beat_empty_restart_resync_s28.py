"""A registry Redis restarted empty under a running `celery beat -S emq` (found by a probe).

The registry has no persistence; it is stopped and a fresh server is started on the same
port. The beat rode the outage out ("Redis is reachable again ... pumping resumes"), then
sent nothing ever again: its schedules were gone from Redis, though it held them in memory,
and only a restart synced them again. Now the end of the outage makes the beat check its
registry, find its keys gone and run its boot sync again: the schedules are back and fire
within seconds, the same beat process, with one WARNING.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from processes import wait_until

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

pytestmark = [pytest.mark.timeout(150)]

APP = textwrap.dedent("""
    import os

    from celery import Celery

    from emq_bridge.celery import recurring

    env = os.environ
    app = Celery("emptyreg", broker=env["ER_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["ER_REGISTRY"],
        emq_bridge_prefix=env["ER_PREFIX"],
        task_default_queue=env["ER_QUEUE"],
        beat_schedule={"tick": {"task": "emptyreg.tick", "schedule": 1.0}},
        result_backend=None,
        result_expires=None,
    )


    @app.task(name="emptyreg.tick")
    def tick():
        pass


    @recurring(every="1h")
    @app.task(name="emptyreg.hourly")
    def hourly():
        pass
""")


def sent_ids(client: redis.Redis, queue: str) -> list[str]:
    """The task ids the beat pushed onto `queue` in the broker (no worker takes them)."""
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


def test_a_beat_whose_registry_restarts_empty_syncs_its_schedules_again_and_fires_them(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "er_app.py").write_text(APP)
    queue = f"{prefix}-emptied"
    data = tmp_path / "registry"
    data.mkdir()
    log = tmp_path / "beat.log"
    registry = EmbeddedServer(directory=str(data)).start()
    port = registry.port
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "ER_BROKER": redis_url,
        "ER_REGISTRY": registry.url,
        "ER_PREFIX": prefix,
        "ER_QUEUE": queue,
    }
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "er_app", "beat", "-S", "emq"),
                *("--pidfile=", f"--schedule={tmp_path / 'beat.db'}", "-l", "info"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def output() -> str:
        return log.read_text(errors="replace")

    try:

        def sent() -> bool:
            assert beat.poll() is None, output()
            return bool(sent_ids(client, queue))

        wait_until(sent, 60, "the beat's first send", then=output)
        registry.stop()  # no persistence: what it held is gone
        time.sleep(1.5)
        registry = EmbeddedServer(port=port, directory=str(data)).start()
        restarted = time.monotonic()
        repeat = Repeat(redis.Redis.from_url(registry.url), prefix)
        before = len(sent_ids(client, queue))

        def back_and_firing() -> bool:
            assert beat.poll() is None, output()
            names = {r.name for r in repeat.list(queue)}
            return {"tick", "emptyreg.hourly"} <= names and len(sent_ids(client, queue)) > before

        # The outage's end triggers the check: well within the minute of the periodic one.
        wait_until(back_and_firing, 30, "the schedules back, firing", then=output)
        took_s = time.monotonic() - restarted
        assert beat.poll() is None  # the same beat: never restarted
        repeat.client.close()
    finally:
        if beat.poll() is None:
            beat.send_signal(signal.SIGTERM)
            try:
                beat.wait(timeout=20)
            except subprocess.TimeoutExpired:
                beat.kill()
                beat.wait()
        registry.stop()
        client.delete(queue)
    text = output()
    lost = [line for line in text.splitlines() if "the registry lost" in line]
    assert len(lost) == 1, text[-3000:]
    assert "WARNING" in lost[0], lost
    assert lost[0].endswith(
        "the registry lost 2 schedule(s) of celery.emptyreg (1), celery.emptyreg.recurring (1) "
        "(Redis restarted empty, or evicted them: its maxmemory-policy must be noeviction): "
        "synced again"
    ), lost
    assert took_s < 30, took_s
