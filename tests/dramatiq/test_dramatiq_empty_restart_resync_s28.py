"""A registry Redis restarted empty under a running `dramatiq` worker (found by a probe).

The registry has no persistence; it is stopped and a fresh server is started on the same
port. The worker's pump rode the outage out, then found nothing to send ever again: the
schedules its actors declare were gone from Redis, and only a restart of the worker synced
them again. Now the end of the outage makes each worker process check its registry, find
its keys gone and run its boot sync again: the schedules are back and run within seconds,
the same worker, with one WARNING (two worker processes race for it: one puts them back).
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
from processes import stop, wait_until

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

pytestmark = [pytest.mark.timeout(150)]

APP = textwrap.dedent("""
    import os

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, recurring

    env = os.environ
    broker = RedisBroker(url=env["ER_BROKER"], namespace=env["ER_NAMESPACE"])
    broker.add_middleware(
        RecurringMiddleware(
            repeat=env["ER_REGISTRY"], prefix=env["ER_PREFIX"], source="emptied", max_sleep_s=0.5
        )
    )
    dramatiq.set_broker(broker)
    results = redis.Redis.from_url(env["ER_BROKER"])


    @recurring(every="1s")
    @dramatiq.actor(queue_name=env["ER_QUEUE"], actor_name="tick")
    def tick():
        results.rpush(env["ER_PREFIX"] + ":ran", 1)


    @recurring(every="1h")
    @dramatiq.actor(queue_name=env["ER_QUEUE"], actor_name="hourly")
    def hourly():
        pass
""")


def test_a_dramatiq_worker_whose_registry_restarts_empty_syncs_its_schedules_again(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    token = uuid.uuid4().hex[:8]
    module, queue, namespace = f"er_app_{token}", f"q{token}", f"er{token}"
    (tmp_path / f"{module}.py").write_text(APP)
    data = tmp_path / "registry"
    data.mkdir()
    registry = EmbeddedServer(directory=str(data)).start()
    port = registry.port
    ran = f"{prefix}:ran"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "ER_BROKER": redis_url,
        "ER_REGISTRY": registry.url,
        "ER_PREFIX": prefix,
        "ER_QUEUE": queue,
        "ER_NAMESPACE": namespace,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "dramatiq", module, "--path", str(tmp_path)),
                *("--processes", "2", "--threads", "2"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: its worker processes are killed too
        )

    def output() -> str:
        return log.read_text(errors="replace")

    try:

        def running() -> bool:
            assert worker.poll() is None, output()[-3000:]
            return bool(client.llen(ran))

        wait_until(running, 60, "the first run", then=output)
        registry.stop()  # no persistence: what it held is gone
        time.sleep(1.5)
        registry = EmbeddedServer(port=port, directory=str(data)).start()
        restarted = time.monotonic()
        repeat = Repeat(redis.Redis.from_url(registry.url), prefix)
        time.sleep(1.5)  # what was in flight at the restart runs out
        before = client.llen(ran)

        def back_and_running() -> bool:
            assert worker.poll() is None, output()[-3000:]
            names = {r.name for r in repeat.list(queue)}
            return {"tick", "hourly"} <= names and client.llen(ran) > before + 1

        # The outage's end triggers the check: well within the minute of the periodic one.
        wait_until(back_and_running, 30, "the schedules back, running", then=output)
        took_s = time.monotonic() - restarted
        assert worker.poll() is None  # the same worker: never restarted
        repeat.client.close()
    finally:
        stop(worker)
        with contextlib.suppress(ProcessLookupError):  # a worker process left behind
            os.killpg(worker.pid, signal.SIGKILL)
        registry.stop()
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        client.delete(ran, *keys)
    text = output()
    lost = [line for line in text.splitlines() if "the registry lost" in line]
    assert len(lost) == 1, text[-3000:]
    assert "[WARNING]" in lost[0], lost
    assert lost[0].endswith(
        "the registry lost 2 schedule(s) of emptied (Redis restarted empty, or evicted them: "
        "its maxmemory-policy must be noeviction): synced again"
    ), lost
    assert took_s < 30, took_s
