"""A guarded task a worker received and had not started, killed with that worker, frees its
schedule once the worker's heartbeats lapse, not at its start timeout.

Found by a chaos probe (session 38): a worker busy with another task holds a guarded
occurrence in its prefetch; SIGKILLed, it takes that occurrence with it, and nothing told the
registry: the occurrence stayed in flight until its start timeout (10 minutes by default),
every slot of its `skip` schedule skipped meanwhile. The worker's main process now heartbeats
the guarded occurrences it holds unstarted, so they are marked lost `3 * heartbeat_s` after
it dies. A real prefork worker, a real Redis broker, a real pump.
"""

from __future__ import annotations

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
from celery import Celery
from processes import celery_pump, stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import os
    import time

    from celery import Celery

    env = os.environ
    app = Celery("pk", broker=env["PK_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["PK_BROKER"],
        emq_bridge_prefix=env["PK_PREFIX"],
        emq_bridge_heartbeat_s=1.0,
        task_default_queue=env["PK_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        imports=["emq_bridge.celery"],
    )


    @app.task(name="pk.block")
    def block():
        time.sleep(60)


    @app.task(name="pk.guarded")
    def guarded():
        pass
""")


def test_a_guarded_task_prefetched_by_a_killed_worker_frees_its_schedule_after_the_heartbeats(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "pk_app.py").write_text(APP)
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    repeat.register(
        queue,
        "guarded",
        every="1h",
        overlap="skip",
        immediately=True,
        template={"task": "pk.guarded"},
    )
    sender = Celery("pk-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    try:
        sender.send_task("pk.block", queue=queue)  # keeps the only pool process busy
        [occurrence] = Pump(repeat, [queue], CeleryDispatcher(sender)).run_once().dispatched
    finally:
        sender.close()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "PK_BROKER": redis_url,
        "PK_PREFIX": prefix,
        "PK_QUEUE": queue,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "pk_app", "worker", "-Q", queue),
                *("-c", "1", "-P", "prefork", "-l", "info"),
                *("--without-mingle", "--without-gossip"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output() -> str:
        return log.read_text(errors="replace")[-3000:]

    try:
        received = f"Task pk.guarded[{occurrence.id}] received"
        wait_until(lambda: received in output(), 30, "the guarded task's receipt", then=output)
        time.sleep(2.5)  # heartbeats of it, as of any worker that holds it for a while
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        killed_at = time.monotonic()
        with celery_pump(repeat, queue, redis_url):

            def freed() -> bool:
                registration = repeat.get(queue, "guarded")
                return registration is not None and registration.inflight is None

            # 3 heartbeats of 1 s, and the pump's next look: well under the start timeout.
            wait_until(freed, 30, "the schedule freed", then=output)
        assert time.monotonic() - killed_at < 30
        registration = repeat.get(queue, "guarded")
        assert registration is not None and registration.lost == 1
        [entry] = repeat.history(queue, "guarded")
        assert (entry.id, entry.status) == (occurrence.id, "lost")
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        stop(worker)
