"""A guarded task's copy that the broker delivers while its first copy still runs does not
run beside it, and reports nothing; a task the worker does not know is reported failed.

Celery's Redis transport delivers an unacked `acks_late` task again once its visibility
timeout passes, to any worker, while the first copy may still run (a task longer than the
timeout). Before, with `overlap="skip"`, each copy ran beside the first (one slot ran six
times in 90 s), and the history entry took the second copy's start with the first copy's
end. Now the worker's main process revokes such a copy on receipt (its occurrence runs,
heartbeated, elsewhere), and its revoke is not the occurrence's. A real prefork worker and a
real Redis broker.
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
from typing import Any

import pytest
import redis
from celery import Celery
from processes import stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RUN_S = 7

APP = textwrap.dedent(f"""
    import json
    import os
    import time

    import redis
    from celery import Celery

    env = os.environ
    app = Celery("rc", broker=env["RC_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["RC_REDIS"],
        emq_bridge_prefix=env["RC_PREFIX"],
        emq_bridge_heartbeat_s=1.0,
        task_default_queue=env["RC_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        # Shorter than the task: the transport delivers it again while it runs.
        broker_transport_options={{
            "visibility_timeout": 2,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }},
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["RC_BROKER"])


    @app.task(bind=True, name="rc.long", acks_late=True)
    def long(self):
        side.rpush(env["RC_NOTES"], json.dumps({{"id": self.request.id, "at": time.time()}}))
        time.sleep({RUN_S})


    @app.task(
        bind=True,
        name="rc.flaky",
        acks_late=True,
        autoretry_for=(ValueError,),
        max_retries=1,
        default_retry_delay=1,
        retry_backoff=False,
        retry_jitter=False,
    )
    def flaky(self):
        note = {{"id": self.request.id, "retries": self.request.retries, "at": time.time()}}
        side.rpush(env["RC_NOTES"], json.dumps(note))
        if not self.request.retries:
            time.sleep({RUN_S})
            raise ValueError("the first attempt fails")
""")


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "rc_app.py").write_text(APP)
    yield tmp_path


def start_worker(app_dir: Path, env: dict[str, str], queue: str) -> subprocess.Popen[bytes]:
    log = app_dir / "worker.log"
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "rc_app", "worker", "-Q", queue),
                *("-c", "3", "-P", "prefork", "-l", "info", "--without-mingle"),
                "--without-gossip",
            ],
            cwd=app_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def environment(app_dir: Path, redis_url: str, prefix: str, queue: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(app_dir), os.environ.get("PYTHONPATH")])),
        "RC_BROKER": redis_url,
        "RC_REDIS": redis_url,
        "RC_PREFIX": prefix,
        "RC_QUEUE": queue,
        "RC_NOTES": f"{prefix}:notes",
    }


def send_one(repeat: Repeat, redis_url: str, queue: str, task: str) -> Any:
    """Register a guarded hourly schedule of `task` due now; send its first slot."""
    repeat.register(
        queue, "nightly", every="1h", overlap="skip", immediately=True, template={"task": task}
    )
    sender = Celery("rc-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    [occurrence] = Pump(repeat, [queue], CeleryDispatcher(sender)).run_once().dispatched
    return occurrence


def started(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis, task: str
) -> tuple[str, Repeat, Any, dict[str, str], subprocess.Popen[bytes]]:
    """A queue of its own, the first slot of a guarded schedule of `task` sent to it, and a
    worker started on it: the queue, the registry, the occurrence, the worker's environment
    and process."""
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    occurrence = send_one(repeat, redis_url, queue, task)
    env = environment(app_dir, redis_url, prefix, queue)
    return queue, repeat, occurrence, env, start_worker(app_dir, env, queue)


def test_a_copy_delivered_while_the_task_runs_is_revoked_on_receipt_and_reports_nothing(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue, repeat, occurrence, env, worker = started(app_dir, redis_url, prefix, client, "rc.long")
    log = app_dir / "worker.log"
    try:

        def ended() -> bool:
            return [e.status for e in repeat.history(queue, "nightly")] == ["succeeded"]

        wait_until(ended, 60, "the run's end", then=lambda: log.read_text(errors="replace")[-3000:])
        output = log.read_text(errors="replace")
        assert "a copy of it runs or ran already" in output, output[-3000:]
        time.sleep(3)  # copies still coming after the end are dropped too
        ran = [json.loads(raw) for raw in client.lrange(env["RC_NOTES"], 0, -1)]
        assert [r["id"] for r in ran] == [occurrence.id], ran
        [entry] = repeat.history(queue, "nightly")
        assert (entry.status, entry.attempt) == ("succeeded", 1)
        # Its start and end are the one run's: it lasted RUN_S seconds.
        assert entry.started_ms is not None and entry.started_ms <= ran[0]["at"] * 1000 + 50
        assert entry.duration_ms is not None and entry.duration_ms >= RUN_S * 1000 - 100
        registration = repeat.get(queue, "nightly")
        assert registration is not None and registration.skipped == 0
    finally:
        stop(worker)


def test_a_task_the_worker_does_not_know_is_reported_failed_and_holds_nothing(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # Before: Celery rejected it for good (NotRegistered) and nothing was reported: a guarded
    # schedule stayed held, every later slot skipped, until its start timeout (10 minutes).
    queue, repeat, occurrence, _, worker = started(app_dir, redis_url, prefix, client, "rc.ghost")
    log = app_dir / "worker.log"
    try:

        def failed() -> bool:
            return [e.status for e in repeat.history(queue, "nightly")] == ["failed"]

        wait_until(failed, 60, "its failure", then=lambda: log.read_text(errors="replace")[-3000:])
        [entry] = repeat.history(queue, "nightly")
        assert entry.id == occurrence.id and "NotRegistered: 'rc.ghost'" in (entry.error or "")
        registration = repeat.get(queue, "nightly")
        assert registration is not None and registration.inflight is None
        assert registration.failures == 0  # its task never ran: no failure streak (s24)
    finally:
        stop(worker)


def test_a_run_whose_copy_was_revoked_on_receipt_can_still_be_terminated(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # Found by a probe (session 25): Celery keeps one request per id, which the copy took
    # over and dropped as it was discarded, so a revoke with terminate=True (an operator's,
    # or `overlap="replace"`'s) found nothing to terminate, and the run went on to its end.
    queue, repeat, occurrence, _, worker = started(app_dir, redis_url, prefix, client, "rc.long")
    log = app_dir / "worker.log"
    try:
        wait_until(
            lambda: "a copy of it runs or ran already" in log.read_text(errors="replace"),
            60,
            "a copy revoked on receipt",
            then=lambda: log.read_text(errors="replace")[-3000:],
        )
        controller = Celery("rc-control", broker=redis_url)
        controller.conf.update(result_backend=None)
        controller.control.revoke(occurrence.id, terminate=True)

        def revoked() -> bool:
            return [e.status for e in repeat.history(queue, "nightly")] == ["revoked"]

        wait_until(revoked, 30, "its revoke", then=lambda: log.read_text(errors="replace")[-3000:])
        output = log.read_text(errors="replace")
        assert f"Terminating {occurrence.id}" in output, output[-3000:]
        [entry] = repeat.history(queue, "nightly")
        assert entry.duration_ms is not None and entry.duration_ms < RUN_S * 1000 - 500
        registration = repeat.get(queue, "nightly")
        assert registration is not None and registration.inflight is None
    finally:
        stop(worker)


def test_the_retry_of_a_run_whose_copy_was_revoked_on_receipt_runs(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # Found by a probe (session 29): the copy was revoked by its id, which Celery keeps in
    # its revoked set for hours, and Celery's own retry of the run has the same id: it was
    # discarded ("Discarding revoked task"), the history stayed `retrying` and the guarded
    # schedule was held until its start timeout (10 minutes), then marked lost.
    queue, repeat, occurrence, env, worker = started(app_dir, redis_url, prefix, client, "rc.flaky")
    log = app_dir / "worker.log"
    try:

        def retried() -> bool:
            return [(e.status, e.attempt) for e in repeat.history(queue, "nightly")] == [
                ("succeeded", 2)
            ]

        wait_until(
            retried, 60, "the retry's end", then=lambda: log.read_text(errors="replace")[-3000:]
        )
        assert "a copy of it runs or ran already" in log.read_text(errors="replace")
        ran = [json.loads(raw) for raw in client.lrange(env["RC_NOTES"], 0, -1)]
        assert [(r["id"], r["retries"]) for r in ran] == [(occurrence.id, 0), (occurrence.id, 1)]
        registration = repeat.get(queue, "nightly")
        assert registration is not None and registration.inflight is None
    finally:
        stop(worker)
