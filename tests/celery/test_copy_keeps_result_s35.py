"""A copy of a guarded occurrence dropped on receipt leaves its run's result alone (found by
a probe of Celery's tooling, session 35).

The worker's main process drops such a copy by revoking it, and Celery's revoked-task path
stored `REVOKED` in the result backend under the id, which is the run's, and sent a
`task-revoked` event for it: a run that failed read `REVOKED` (`AsyncResult(id).get()`
raised `TaskRevokedError`, not its error), Flower showed it revoked. A real prefork worker,
a real Redis broker and result backend; the copy is the message pushed again, as the Redis
transport delivers an unacked one again.
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

APP = textwrap.dedent("""
    import os

    from celery import Celery

    env = os.environ
    app = Celery("cr", broker=env["CR_BROKER"], backend=env["CR_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["CR_BROKER"],
        emq_bridge_prefix=env["CR_PREFIX"],
        task_default_queue=env["CR_QUEUE"],
        broker_connection_retry_on_startup=True,
        imports=["emq_bridge.celery"],
    )


    @app.task(name="cr.fails")
    def fails():
        raise ValueError("the nightly report failed")
""")


def test_a_copy_after_a_failed_run_leaves_its_failure_in_the_result_backend(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "cr_app.py").write_text(APP)
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    repeat.register(
        queue,
        "nightly",
        every="1h",
        overlap="skip",
        immediately=True,
        template={"task": "cr.fails"},
    )
    sender = Celery("cr-sender", broker=redis_url, backend=redis_url)
    sender.conf.update(task_default_queue=queue)
    [occurrence] = Pump(repeat, [queue], CeleryDispatcher(sender)).run_once().dispatched
    [message] = client.lrange(queue, 0, -1)  # kombu's Redis transport: the queue's list
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "CR_BROKER": redis_url,
        "CR_PREFIX": prefix,
        "CR_QUEUE": queue,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "cr_app", "worker", "-Q", queue),
                *("-c", "1", "-P", "prefork", "-l", "info", "--without-mingle"),
                "--without-gossip",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    result = sender.AsyncResult(occurrence.id)
    try:
        wait_until(
            lambda: [e.status for e in repeat.history(queue, "nightly")] == ["failed"],
            60,
            "the run's failure",
            then=lambda: log.read_text(errors="replace")[-3000:],
        )
        assert result.state == "FAILURE"
        client.lpush(queue, message)  # the same message again
        wait_until(
            lambda: "a copy of it runs or ran already" in log.read_text(errors="replace"),
            30,
            "the copy dropped on receipt",
            then=lambda: log.read_text(errors="replace")[-3000:],
        )
        # An attempt that ended: it says what runs the schedule again instead.
        assert "this attempt ended" in log.read_text(errors="replace")
        assert "`emq-bridge trigger QUEUE NAME` runs the schedule now" in log.read_text()
        fresh = Celery("cr-reader", backend=redis_url).AsyncResult(occurrence.id)
        assert fresh.state == "FAILURE", fresh.state
        assert isinstance(fresh.result, ValueError)
        assert [e.status for e in repeat.history(queue, "nightly")] == ["failed"]
    finally:
        stop(worker)
        sender.close()
