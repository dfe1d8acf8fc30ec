"""A guarded task's message that Celery requeues runs again, and a requeue that nothing will
do is a failure: real prefork workers, a real Redis broker, a real pump.

On a Redis and on a RabbitMQ broker. Found by a probe (session 32):

* `task_acks_late` with `task_reject_on_worker_lost` on an `overlap="skip"` task whose pool
  process was SIGKILLed: Celery requeues its message at once, and the worker revoked the copy
  on receipt as "delivered twice", since the dead process's heartbeats were still live; the
  occurrence ended `lost` and never ran again (with `allow` it re-ran). Now the copy is held
  and sent again once those heartbeats would have lapsed, and runs then.
* `Reject(requeue=True)` of an acks-late guarded task whose run lasted past the reporter's
  linger: the pool process heartbeated the rejected run for as long as it lived, so its
  requeued copy was revoked on receipt and the schedule stayed held (`running`) for good.
* `Reject(requeue=True)` without `acks_late`: Celery acked the message before the task ran,
  so nothing requeues it; nothing was reported, and the occurrence was `lost` after the
  heartbeats' bound with no error. Now it is `failed`, saying so.
"""

from __future__ import annotations

import json
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from processes import celery_worker, stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Longer than Celery takes to requeue a killed pool process's task (it may wait for the
# process's result up to `worker_lost_wait`, 10 s): a copy that comes after the run's
# heartbeats lapsed runs on receipt, as it did before.
HEARTBEAT_S = 4.0

APP = textwrap.dedent(f"""
    import json
    import os
    import signal
    import time

    import redis
    from celery import Celery
    from celery.exceptions import Reject

    env = os.environ
    app = Celery("rq", broker=env["RQ_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["RQ_REDIS"],
        emq_bridge_prefix=env["RQ_PREFIX"],
        emq_bridge_heartbeat_s={HEARTBEAT_S},
        task_default_queue=env["RQ_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["RQ_REDIS"])
    PREFIX = env["RQ_PREFIX"]


    def first_run(task):
        # Whether this is the first delivery of this task's message, noted on the side.
        request = task.request
        count = side.incr(f"{{PREFIX}}:count:{{task.name}}:{{request.id}}")
        side.rpush(
            PREFIX + ":notes",
            json.dumps({{"task": task.name, "id": request.id, "delivery": count}}),
        )
        return count == 1


    @app.task(bind=True, name="rq.killed", acks_late=True, reject_on_worker_lost=True)
    def killed(self):
        if first_run(self):
            time.sleep(0.3)  # its start reported (the reporter's linger is 50 ms)
            os.kill(os.getpid(), signal.SIGKILL)
        return "ran again"


    @app.task(bind=True, name="rq.rejected_late", acks_late=True)
    def rejected_late(self):
        if first_run(self):
            time.sleep(0.3)  # its start reported: the registry has it running
            raise Reject("later", requeue=True)
        return "ran again"


    @app.task(bind=True, name="rq.rejected_early")
    def rejected_early(self):
        first_run(self)
        raise Reject("later", requeue=True)
""")

SCHEDULES = {"killed": "rq.killed", "late": "rq.rejected_late", "early": "rq.rejected_early"}


@dataclass
class Stack:
    queue: str
    repeat: Repeat
    broker: redis.Redis
    prefix: str
    log: Path
    ids: dict[str, str]

    def notes(self, name: str) -> list[dict[str, Any]]:
        raw = self.broker.lrange(f"{self.prefix}:notes", 0, -1)
        notes = [json.loads(item) for item in raw]
        return [n for n in notes if n["task"] == SCHEDULES[name]]

    def statuses(self, name: str) -> list[tuple[str, int]]:
        return [(e.status, e.attempt) for e in self.repeat.history(self.queue, name)]

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def stack(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    broker_url = redis_url if request.param == "redis" else request.getfixturevalue("rabbitmq_url")
    app_dir = tmp_path_factory.mktemp("requeue")
    (app_dir / "rq_app.py").write_text(APP)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-q"
    broker = redis.Redis.from_url(redis_url)
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    for name, task in SCHEDULES.items():
        repeat.register(
            queue, name, every="1h", overlap="skip", immediately=True, template={"task": task}
        )
    worker, log = celery_worker(
        app_dir,
        "rq_app",
        queue,
        {"RQ_BROKER": broker_url, "RQ_REDIS": redis_url, "RQ_PREFIX": prefix, "RQ_QUEUE": queue},
        concurrency=3,
    )
    sender = Celery("rq-sender", broker=broker_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    # A real pump, running all along: it sends the first slots and marks lost what is lost.
    pump = Pump(repeat, [queue], CeleryDispatcher(sender), max_sleep_s=0.5)
    halt = threading.Event()
    thread = threading.Thread(target=pump.run, args=(halt,), daemon=True)
    thread.start()
    ids: dict[str, str] = {}
    try:
        wait_until(lambda: all(repeat.history(queue, n) for n in SCHEDULES), 30, "the sends")
        ids = {name: repeat.history(queue, name)[0].id for name in SCHEDULES}
        yield Stack(queue, repeat, broker, prefix, log, ids)
    finally:
        halt.set()
        thread.join(10)
        stop(worker)
        sender.close()


def test_a_guarded_task_requeued_after_its_pool_process_was_killed_runs_again(
    stack: Stack,
) -> None:
    # Before: revoked on receipt ("a copy of it runs or ran already"), then marked lost.
    wait_until(
        lambda: stack.statuses("killed") == [("succeeded", 1)],
        90,
        "the requeued copy's run",
        then=lambda: f"{stack.statuses('killed')} {stack.notes('killed')}\n{stack.output()}",
    )
    deliveries = [(n["id"], n["delivery"]) for n in stack.notes("killed")]
    assert deliveries == [(stack.ids["killed"], 1), (stack.ids["killed"], 2)]
    output = stack.log.read_text(errors="replace")
    assert "held, and sent again in 13 s" in output, output[-4000:]
    assert "held back is sent again" in output, output[-4000:]
    registration = stack.repeat.get(stack.queue, "killed")
    assert registration is not None
    assert (registration.inflight, registration.failures) == (None, 0)
    # The pump may mark it lost as the killed run's heartbeats lapse, a second before the
    # held copy is sent again; the copy's run then replaces `lost` (counted once).
    assert registration.lost <= 1


def test_an_acks_late_guarded_task_rejected_with_requeue_runs_again(stack: Stack) -> None:
    # Before: its pool process heartbeated the rejected run as long as it lived; the requeued
    # copy was revoked on receipt, and the occurrence stayed running, its schedule held.
    wait_until(
        lambda: stack.statuses("late") == [("succeeded", 1)],
        90,
        "the requeued message's run",
        then=lambda: f"{stack.statuses('late')} {stack.notes('late')}\n{stack.output()}",
    )
    deliveries = [(n["id"], n["delivery"]) for n in stack.notes("late")]
    assert deliveries == [(stack.ids["late"], 1), (stack.ids["late"], 2)]
    registration = stack.repeat.get(stack.queue, "late")
    assert registration is not None and registration.inflight is None


def test_a_requeue_of_a_task_acked_early_is_a_failure_that_says_why(stack: Stack) -> None:
    # Before: nothing reported; lost after the heartbeats' bound, with no error.
    wait_until(
        lambda: stack.statuses("early") != [("running", 1)] and stack.statuses("early"),
        30,
        "the rejected run's end",
        then=stack.output,
    )
    [entry] = stack.repeat.history(stack.queue, "early")
    assert (entry.id, entry.status, entry.attempt) == (stack.ids["early"], "failed", 1)
    assert entry.error == (
        "Reject: later (requeue ignored: the message was acked before the task ran)"
    )
    registration = stack.repeat.get(stack.queue, "early")
    assert registration is not None
    assert (registration.inflight, registration.failures) == (None, 1)
    assert [n["delivery"] for n in stack.notes("early")] == [1]  # it never ran again
