"""A Celery worker killed as a guarded task starts frees its schedule within the heartbeats'
bound, not the start timeout (found by a probe, session 26).

A pool process's `started` report waits aside for the reporter's linger (50 ms) so a short
task reports once; a worker killed in that while (an OOM kill, a lost node) never sent it,
and the occurrence stayed in flight for the pump's start timeout, 10 minutes, every slot of
the `skip` schedule skipped. Now `task_prerun` marks a guarded occurrence in flight at once
(one round trip, as Dramatiq's middleware does), so it is lost `3 * emq_bridge_heartbeat_s`
after the kill. A real prefork worker on a real Redis broker, killed as a whole by its task.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery
from processes import stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HEARTBEAT_S = 1.0

APP = textwrap.dedent("""
    import os
    import signal

    from celery import Celery

    env = os.environ
    app = Celery("ks", broker=env["KS_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["KS_BROKER"],
        emq_bridge_prefix=env["KS_PREFIX"],
        emq_bridge_heartbeat_s=float(env["KS_HEARTBEAT_S"]),
        task_default_queue=env["KS_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        imports=["emq_bridge.celery"],
    )


    @app.task(name="ks.die")
    def die():
        os.killpg(os.getpgid(0), signal.SIGKILL)  # the whole worker, as an OOM kill would
""")


def test_a_worker_killed_as_its_guarded_task_starts_leaves_it_lost_within_the_heartbeats(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "ks_app.py").write_text(APP)
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    repeat.register(
        queue, "nightly", every="1h", overlap="skip", immediately=True, template={"task": "ks.die"}
    )
    sender = Celery("ks-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    pump = Pump(repeat, [queue], CeleryDispatcher(sender))
    [occurrence] = pump.run_once().dispatched
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "KS_BROKER": redis_url,
        "KS_PREFIX": prefix,
        "KS_QUEUE": queue,
        "KS_HEARTBEAT_S": str(HEARTBEAT_S),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "ks_app", "worker", "-Q", queue),
                *("-c", "1", "-P", "prefork", "-l", "info", "--without-mingle"),
                "--without-gossip",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own: its task kills the group
        )
    try:
        wait_until(
            lambda: worker.poll() is not None,
            60,
            "the worker killed by its task",
            then=lambda: log.read_text(errors="replace")[-3000:],
        )
        # In flight for the heartbeats' bound from its start, not the start timeout's.
        deadline = client.zscore(repeat.keys(queue).running, occurrence.lease_member)
        now = repeat.server_time_ms()
        assert deadline is not None and deadline <= now + 3 * HEARTBEAT_S * 1000, (
            deadline - now if deadline is not None else None
        )

        def lost() -> bool:
            pump.run_once()
            return [(e.id, e.status) for e in repeat.history(queue, "nightly")] == [
                (occurrence.id, "lost")
            ]

        wait_until(lost, 3 * HEARTBEAT_S + 10, "the killed run marked lost")
        registration = repeat.get(queue, "nightly")
        assert registration is not None and registration.inflight is None
    finally:
        stop(worker)
        sender.close()
