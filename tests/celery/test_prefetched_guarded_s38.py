"""A guarded task that waits in a worker's prefetch: two copies of it run once, and a
worker killed with it frees its schedule once its heartbeats lapse.

Both found in session 38, with a real prefork worker and a real Redis broker:

* Celery's Redis transport delivers an unacked message again once its visibility timeout
  passes, and a message that waited that long in a busy worker's prefetch can come back to
  the same worker. The copy check on receipt asked the registry, which knew of no run yet
  (neither copy had started), so both copies passed it, and a pool process cannot refuse a
  task: a `skip` schedule's one slot ran twice, back to back. Now the worker's main process
  knows the first copy by its id and attempt (`worker_state.requests`) and drops the second
  on receipt. The copy is pushed into the broker's list by hand, as the restore pushes it.
* A worker busy with another task holds a guarded occurrence in its prefetch; SIGKILLed, it
  took that occurrence with it, and nothing told the registry: the occurrence stayed in
  flight until its start timeout (10 minutes by default), every slot of its `skip` schedule
  skipped meanwhile (a chaos probe). The worker's main process now heartbeats the guarded
  occurrences it holds unstarted, so they are marked lost `3 * heartbeat_s` after it dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from processes import celery_pump, stop, wait_until

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.lifecycle import START_TIMEOUT_MS

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
        emq_bridge_heartbeat_s=1.0,
        task_default_queue=env["PT_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=8,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["PT_BROKER"])


    @app.task(name="pt.block")
    def block(seconds):
        time.sleep(seconds)


    @app.task(bind=True, name="pt.nightly")
    def nightly(self):
        side.rpush(env["PT_NOTES"], json.dumps({"id": self.request.id, "at": time.time()}))
        time.sleep(0.5)


    @app.task(bind=True, name="pt.limited", rate_limit="20/m")  # a token every 3 s
    def limited(self, *args):
        if not args:  # the blocker (args) takes the first token; the occurrence notes its run
            side.rpush(env["PT_NOTES"], json.dumps({"id": self.request.id, "at": time.time()}))
""")


class Setup:
    """A queue of its own holding `blockers` tasks that sleep `block_s` each, then the first
    slot of a guarded hourly schedule (`options` in its template), sent by a pump; and the
    worker started on it, its log and what its runs noted."""

    def __init__(
        self,
        tmp_path: Path,
        redis_url: str,
        prefix: str,
        client: redis.Redis,
        *,
        blockers: int,
        block_s: float,
        options: dict[str, Any],
        task: str = "pt.nightly",
    ) -> None:
        (tmp_path / "pt_app.py").write_text(APP)
        self.tmp_path, self.client = tmp_path, client
        self.queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.notes = f"{prefix}:notes"
        self.repeat = Repeat(client, prefix)
        self.repeat.register(
            self.queue,
            "nightly",
            every="1h",
            overlap="skip",
            immediately=True,
            template={"task": task, "options": options},
        )
        sender = Celery("pt-sender", broker=redis_url)
        sender.conf.update(result_backend=None, task_default_queue=self.queue)
        try:
            # Behind tasks that keep the worker's pool busy: what it prefetches waits.
            for _ in range(blockers):
                blocker = "pt.block" if task == "pt.nightly" else task
                sender.send_task(blocker, args=[block_s], queue=self.queue)
            pump = Pump(self.repeat, [self.queue], CeleryDispatcher(sender))
            [self.occurrence] = pump.run_once().dispatched
        finally:
            sender.close()
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
            "PT_BROKER": redis_url,
            "PT_PREFIX": prefix,
            "PT_QUEUE": self.queue,
            "PT_NOTES": self.notes,
        }
        self.log = tmp_path / "worker.log"
        self.worker: subprocess.Popen[bytes] | None = None

    def start(self, concurrency: int) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as out:
            self.worker = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "pt_app", "worker", "-Q", self.queue),
                    *("-c", str(concurrency), "-P", "prefork", "-l", "info"),
                    *("--without-mingle", "--without-gossip"),
                ],
                cwd=self.tmp_path,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, to kill it with its children
            )
        return self.worker

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def ran(self) -> list[str]:
        return [json.loads(raw)["id"] for raw in self.client.lrange(self.notes, 0, -1)]

    def close(self) -> None:
        """Kill the worker and its pool processes, if still running (a failed test's)."""
        if self.worker is not None and self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait(timeout=10)


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
    setup = Setup(
        tmp_path, redis_url, prefix, client, blockers=concurrency, block_s=2, options=options
    )
    # The Redis transport pushes new messages at the list's head; the copy is the same
    # message, as a restore pushes it back.
    message = client.lindex(setup.queue, 0)
    assert message is not None and setup.occurrence.id in message.decode()
    client.lpush(setup.queue, message)
    worker = setup.start(concurrency)
    try:

        def ended() -> bool:
            return [e.status for e in setup.repeat.history(setup.queue, "nightly")] == ["succeeded"]

        wait_until(ended, 60, "the run's end", then=setup.output)
        # Both copies were received (the second, dropped, is discarded when it would run).
        wait_until(
            lambda: "another copy of it" in setup.output(), 10, "the drop", then=setup.output
        )
        wait_until(lambda: client.llen(setup.queue) == 0, 10, "an empty queue", then=setup.output)
        stop(worker)
        assert setup.ran() == [setup.occurrence.id], setup.output()
        [entry] = setup.repeat.history(setup.queue, "nightly")
        assert (entry.status, entry.attempt) == ("succeeded", 1)
        registration = setup.repeat.get(setup.queue, "nightly")
        assert registration is not None and registration.inflight is None
    finally:
        setup.close()


def test_two_copies_of_a_rate_limited_task_waiting_for_a_token_run_once(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # Session 39's Celery probe: a rate-limited task waits for its token in the consumer's
    # bucket, out of Celery's request sets, so a copy the Redis transport restored past its
    # visibility timeout passed the check on receipt and both ran (each restore one more
    # copy: 25 runs of one occurrence). The copy is found in the bucket and dropped.
    setup = Setup(
        tmp_path, redis_url, prefix, client, blockers=1, block_s=0, options={}, task="pt.limited"
    )
    message = client.lindex(setup.queue, 0)
    assert message is not None and setup.occurrence.id in message.decode()
    client.lpush(setup.queue, message)
    worker = setup.start(1)
    try:

        def ended() -> bool:
            return [e.status for e in setup.repeat.history(setup.queue, "nightly")] == ["succeeded"]

        wait_until(ended, 60, "the run's end", then=setup.output)
        wait_until(
            lambda: "another copy of it" in setup.output(), 10, "the drop", then=setup.output
        )
        time.sleep(7)  # two more tokens: the copy would have run by now
        stop(worker)
        assert setup.ran() == [setup.occurrence.id], setup.output()
        [entry] = setup.repeat.history(setup.queue, "nightly")
        assert (entry.status, entry.attempt) == ("succeeded", 1)
    finally:
        setup.close()


def test_a_guarded_task_prefetched_by_a_killed_worker_frees_its_schedule_after_the_heartbeats(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    setup = Setup(tmp_path, redis_url, prefix, client, blockers=1, block_s=60, options={})
    occurrence: Occurrence = setup.occurrence
    worker = setup.start(1)
    try:
        received = f"Task pt.nightly[{occurrence.id}] received"
        wait_until(
            lambda: received in setup.output(), 30, "the guarded task's receipt", then=setup.output
        )
        time.sleep(2.5)  # heartbeats of it, as of any worker that holds it for a while
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        killed_at = time.monotonic()
        with celery_pump(setup.repeat, setup.queue, redis_url):

            def freed() -> bool:
                registration = setup.repeat.get(setup.queue, "nightly")
                return registration is not None and registration.inflight is None

            # 3 heartbeats of 1 s, and the pump's next look: well under the start timeout.
            wait_until(freed, 30, "the schedule freed", then=setup.output)
        assert time.monotonic() - killed_at < 30
        registration = setup.repeat.get(setup.queue, "nightly")
        assert registration is not None and registration.lost == 1
        [entry] = setup.repeat.history(setup.queue, "nightly")
        assert (entry.id, entry.status) == (occurrence.id, "lost")
        assert setup.ran() == []
    finally:
        setup.close()


def test_a_guarded_task_a_stopping_worker_held_unstarted_is_handed_back_and_runs_later(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # Session 39: heartbeated while the worker holds it (above), the occurrence would be lost
    # `3 * heartbeat_s` after a warm shutdown put its message back in the broker, with no
    # worker yet to take it (a deploy that replaces the only worker). The stopping worker
    # hands it back: in flight for the start timeout from the stop, as a fresh send.
    setup = Setup(tmp_path, redis_url, prefix, client, blockers=1, block_s=3, options={})
    occurrence: Occurrence = setup.occurrence
    running_key = setup.repeat.keys(setup.queue).running
    member = f"{occurrence.name} {occurrence.due_ms}"
    worker = setup.start(1)
    try:
        received = f"Task pt.nightly[{occurrence.id}] received"
        wait_until(
            lambda: received in setup.output(), 30, "the guarded task's receipt", then=setup.output
        )
        time.sleep(1.5)  # heartbeated as waiting: in flight for 3 heartbeats of 1 s
        seconds, _ = client.time()
        deadline = client.zscore(running_key, member)
        assert deadline is not None and deadline - seconds * 1000 <= 3_000 + 500
        stop(worker)  # a warm shutdown: the block ends, the guarded task goes back unrun
        assert setup.ran() == [], setup.output()
        time.sleep(3.5)  # past what its heartbeats gave
        seconds, _ = client.time()
        deadline = client.zscore(running_key, member)
        assert deadline is not None, setup.output()
        assert deadline - seconds * 1000 > START_TIMEOUT_MS - 60_000, setup.output()
        sender = Celery("x", broker=redis_url)
        Pump(setup.repeat, [setup.queue], CeleryDispatcher(sender)).run_once()  # a lost mark?
        assert setup.repeat.history(setup.queue, "nightly") == []  # not lost
        worker = setup.start(1)
        wait_until(lambda: setup.ran() == [occurrence.id], 30, "its run", then=setup.output)

        def ended() -> bool:
            return [e.status for e in setup.repeat.history(setup.queue, "nightly")] == ["succeeded"]

        wait_until(ended, 30, "its success reported", then=setup.output)
        stop(worker)
    finally:
        setup.close()
