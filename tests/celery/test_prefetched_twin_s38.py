"""Two copies of one guarded task's message, both in one worker's prefetch before either
started, run once.

Celery's Redis transport delivers an unacked message again once its visibility timeout
passes, and a message that waited that long in a busy worker's prefetch can come back to
the same worker. Before, the copy check on receipt asked the registry, which knew of no run
yet (neither copy had started), so both copies passed it, and the pool process cannot
refuse a task: a `skip` schedule's one slot ran twice, back to back. Now the worker's main
process knows the first copy by its id and attempt (`worker_state.requests`) and revokes the
second on receipt. A real prefork worker and a real Redis broker; the copy is pushed into
the broker's list by hand, as the transport's restore pushes it.
"""

from __future__ import annotations

import json
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
    import json
    import os
    import time

    import redis
    from celery import Celery

    env = os.environ
    app = Celery("pt", broker=env["PT_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["PT_BROKER"],
        emq_bridge_prefix=env["PT_PREFIX"],
        task_default_queue=env["PT_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=8,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["PT_BROKER"])


    @app.task(name="pt.block")
    def block():
        time.sleep(2)


    @app.task(bind=True, name="pt.nightly")
    def nightly(self):
        side.rpush(env["PT_NOTES"], json.dumps({"id": self.request.id, "at": time.time()}))
        time.sleep(0.5)
""")


@pytest.mark.parametrize(
    ("concurrency", "options"),
    [
        (1, {}),
        (2, {}),
        # Copies that wait for their eta: Celery checks for a revoke only when it runs one.
        (1, {"countdown": 3}),
    ],
)
def test_two_copies_prefetched_into_one_worker_run_once(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    client: redis.Redis,
    concurrency: int,
    options: dict[str, int],
) -> None:
    (tmp_path / "pt_app.py").write_text(APP)
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    notes = f"{prefix}:notes"
    repeat = Repeat(client, prefix)
    repeat.register(
        queue,
        "nightly",
        every="1h",
        overlap="skip",
        immediately=True,
        template={"task": "pt.nightly", "options": options},
    )
    sender = Celery("pt-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    try:
        # Behind a task that keeps the worker's pool busy: what it prefetches waits.
        for _ in range(concurrency):
            sender.send_task("pt.block", queue=queue)
        [occurrence] = Pump(repeat, [queue], CeleryDispatcher(sender)).run_once().dispatched
    finally:
        sender.close()
    # The Redis transport pushes new messages at the list's head; the copy is the same
    # message, as a restore pushes it back.
    message = client.lindex(queue, 0)
    assert message is not None and occurrence.id in message.decode()
    client.lpush(queue, message)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "PT_BROKER": redis_url,
        "PT_PREFIX": prefix,
        "PT_QUEUE": queue,
        "PT_NOTES": notes,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "pt_app", "worker", "-Q", queue),
                *("-c", str(concurrency), "-P", "prefork", "-l", "info"),
                *("--without-mingle", "--without-gossip"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def ended() -> bool:
            return [e.status for e in repeat.history(queue, "nightly")] == ["succeeded"]

        def output() -> str:
            return log.read_text(errors="replace")[-3000:]

        wait_until(ended, 60, "the run's end", then=output)
        # Both copies were received (the second, revoked, is discarded at once).
        wait_until(lambda: "another copy of it" in output(), 10, "the copy's drop", then=output)
        wait_until(lambda: client.llen(queue) == 0, 10, "an empty queue", then=output)
        stop(worker)
        ran = [json.loads(raw) for raw in client.lrange(notes, 0, -1)]
        assert [r["id"] for r in ran] == [occurrence.id], (ran, output())
        [entry] = repeat.history(queue, "nightly")
        assert (entry.status, entry.attempt) == ("succeeded", 1)
        registration = repeat.get(queue, "nightly")
        assert registration is not None and registration.inflight is None
    finally:
        stop(worker)
