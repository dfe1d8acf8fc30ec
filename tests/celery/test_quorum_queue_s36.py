"""A guarded schedule on a RabbitMQ quorum queue, as teams declare their queues today (a
probe of quorum queues, session 36, found the run, the overlap policy and the lifecycle
held; this keeps it so): a real prefork worker consuming a quorum queue (Celery then turns
global QoS off), a real pump sending through `CeleryDispatcher` with publisher confirms.
Each slot runs at most once and no two runs of the `skip` schedule overlap; the history
says `succeeded` and `skipped`. docs/celery.md, "RabbitMQ quorum queues".
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu import Queue
from processes import celery_worker, stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

APP = textwrap.dedent("""
    import json
    import os
    import time

    import redis
    from celery import Celery
    from kombu import Queue

    env = os.environ
    app = Celery("qq", broker=env["QQ_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["QQ_REDIS"],
        emq_bridge_prefix=env["QQ_PREFIX"],
        emq_bridge_heartbeat_s=1.0,
        task_queues=[Queue(env["QQ_QUEUE"], queue_arguments={"x-queue-type": "quorum"})],
        task_default_queue=env["QQ_QUEUE"],
        broker_transport_options={"confirm_publish": True},
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        result_backend=None,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["QQ_REDIS"])


    @app.task(bind=True, name="qq.slow")
    def slow(self):
        started = time.time()
        time.sleep(2.5)
        side.rpush(env["QQ_PREFIX"] + ":runs", json.dumps(
            {"id": self.request.id, "start": started, "end": time.time()}))
""")


def test_a_skip_schedule_on_a_quorum_queue_runs_each_slot_once_never_overlapping(
    redis_url: str, rabbitmq_url: str, tmp_path: Path
) -> None:
    (tmp_path / "qq_app.py").write_text(APP)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-quorum"
    side = redis.Redis.from_url(redis_url)
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register(queue, "slow", every="1s", overlap="skip", template={"task": "qq.slow"})
    sender = Celery("qq-sender", broker=rabbitmq_url)
    sender.conf.update(
        result_backend=None,
        task_queues=[Queue(queue, queue_arguments={"x-queue-type": "quorum"})],
        task_default_queue=queue,
        broker_transport_options={"confirm_publish": True},
    )
    variables = {"QQ_BROKER": rabbitmq_url, "QQ_REDIS": redis_url, "QQ_PREFIX": prefix}
    worker, log = celery_worker(tmp_path, "qq_app", queue, {**variables, "QQ_QUEUE": queue})
    pump = Pump(repeat, [queue], CeleryDispatcher(sender), max_sleep_s=0.2)
    halt = threading.Event()
    thread = threading.Thread(target=pump.run, args=(halt,), daemon=True)
    try:
        wait_until(lambda: b"ready." in log.read_bytes(), 60, "the worker", then=log.read_text)
        thread.start()
        time.sleep(9)
        halt.set()
        thread.join(10)
        wait_until(
            lambda: all(e.status != "running" for e in repeat.history(queue, "slow")),
            30,
            "the last run's end",
        )
        runs = [json.loads(r) for r in side.lrange(f"{prefix}:runs", 0, -1)]
        assert len(runs) >= 2, log.read_text()[-3000:]
        assert len({r["id"] for r in runs}) == len(runs)  # each slot at most once
        spans = sorted((r["start"], r["end"]) for r in runs)
        assert all(a[1] <= b[0] + 0.05 for a, b in pairwise(spans)), spans
        statuses = {e.status for e in repeat.history(queue, "slow")}
        assert "succeeded" in statuses and "skipped" in statuses, statuses
        assert "Global QoS is disabled" in log.read_text()  # a quorum queue, as Celery saw it
    finally:
        halt.set()
        stop(worker)
        with sender.connection_for_write() as connection:
            Queue(queue).bind(connection.default_channel).delete()
        sender.close()
        side.close()
