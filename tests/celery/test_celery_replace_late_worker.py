"""`overlap="replace"` when no worker hears the revoke: a worker that starts later runs only
the occurrence in flight.

`replace` revokes the occurrence it replaces with Celery's `revoke` broadcast, which only
workers alive at that moment hear. With no worker up (all of them restarting, a queue
backlog), the pump sends a slot, then replaces it at the next slot, and the next: each
replaced message waits in the broker. A worker that starts then must not run them side by
side: it checks each guarded task when it receives it, and revokes the ones whose
registration has another occurrence in flight (their history says `revoked`); only the one
in flight runs. A real prefork worker and a real Redis broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import json
    import os
    import time

    import redis
    from celery import Celery

    env = os.environ
    app = Celery("lw", broker=env["LW_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["LW_REDIS"],
        emq_bridge_prefix=env["LW_PREFIX"],
        emq_bridge_heartbeat_s=1.0,
        task_default_queue=env["LW_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=4,
        imports=["emq_bridge.celery"],  # its signal receivers (docs/celery.md)
    )
    side = redis.Redis.from_url(env["LW_BROKER"])


    @app.task(bind=True, name="lw.long")
    def long(self):
        side.rpush(env["LW_NOTES"], json.dumps({"id": self.request.id, "at": time.time()}))
        time.sleep(2)
""")


def wait_until(check: Callable[[], Any], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "lw_app.py").write_text(APP)
    yield tmp_path


def test_a_worker_started_after_replace_revoked_with_no_worker_up_runs_only_the_one_in_flight(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    notes = f"{prefix}:notes"
    repeat = Repeat(client, prefix)
    repeat.register(queue, "rebuild", every="1s", overlap="replace", template={"task": "lw.long"})
    sender = Celery("lw-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    pump = Pump(repeat, [queue], CeleryDispatcher(sender))
    # No worker: each slot replaces the one before (its revoke reaches nobody).
    sent: list[str] = []
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:
        sent += [o.id for o in pump.run_once().dispatched]
        time.sleep(0.1)
    assert len(sent) >= 3, sent
    in_flight = repeat.get(queue, "rebuild")
    assert in_flight is not None and in_flight.inflight is not None
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(app_dir), os.environ.get("PYTHONPATH")])),
        "LW_BROKER": redis_url,
        "LW_REDIS": redis_url,
        "LW_PREFIX": prefix,
        "LW_QUEUE": queue,
        "LW_NOTES": notes,
    }
    log = app_dir / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "lw_app", "worker", "-Q", queue),
                *("-c", "3", "-P", "prefork", "-l", "info", "--without-mingle"),
                "--without-gossip",
            ],
            cwd=app_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        last = sent[-1]

        def settled() -> bool:
            entries = {e.id: e.status for e in repeat.history(queue, "rebuild")}
            return entries.get(last) == "succeeded" and all(
                entries.get(i) == "revoked" for i in sent[:-1]
            )

        assert wait_until(settled, 60), (
            [(e.id, e.status) for e in repeat.history(queue, "rebuild")],
            sent,
            log.read_text(errors="replace")[-3000:],
        )
        ran = [json.loads(raw)["id"] for raw in client.lrange(notes, 0, -1)]
        assert ran == [last], ran  # the replaced ones never ran, not even beside it
        output = log.read_text(errors="replace")
        assert output.count("revoked on receipt") == len(sent) - 1, output[-3000:]
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        client.delete(notes, queue)
