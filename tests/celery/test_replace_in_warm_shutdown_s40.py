"""`overlap="replace"` against a worker in warm shutdown: the replaced run is terminated.

Left open by sessions 32 to 39 (documented in docs/celery.md): a Celery worker in warm
shutdown (SIGTERM: it finishes its running tasks) no longer reads remote-control commands,
so the `revoke(id, terminate=True)` a pump sends for a `replace` never reached it, and the
run it was finishing overlapped its replacement until it ended (a deploy's SIGTERM, a long
task: minutes). Now `report.lua` tells a heartbeat whose run a `replace` took over (its
registration's policy is `replace`, the run is not the one in flight, nor in flight beside
it), and the worker's main process, which heartbeats its pool's runs, terminates that run
as the revoke would have: within `emq_bridge_heartbeat_s`, reported `revoked`. So it does
on a worker that takes no remote control at all (`worker_enable_remote_control = False`),
where no `replace` ever terminated a run.

A real prefork worker, a real Redis broker, a real pump.
"""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from processes import celery_pump, celery_worker, stop, wait_until

from emq_bridge import Repeat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HEARTBEAT_S = 0.5
LONG_S = 60  # the replaced run, left alone: the worker would wait for it this long
EVERY_S = 3  # the replacement's slot comes this long after the first

APP = textwrap.dedent(f"""
    import json, os, time
    import redis
    from celery import Celery

    env = os.environ
    app = Celery("ws", broker=env["WS_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["WS_BROKER"],
        emq_bridge_prefix=env["WS_PREFIX"],
        emq_bridge_heartbeat_s={HEARTBEAT_S},
        task_default_queue=env["WS_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=env.get("WS_REMOTE_CONTROL", "1") == "1",
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["WS_BROKER"])


    @app.task(bind=True, name="ws.long")
    def long(self):
        side.rpush(env["WS_PREFIX"] + ":notes", json.dumps({{"id": self.request.id}}))
        time.sleep({LONG_S})
""")


def fired(repeat: Repeat, queue: str) -> int:
    found = repeat.get(queue, "long")
    return found.fired if found is not None else 0


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "ws_app.py").write_text(APP)
    return tmp_path


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


@dataclass
class Stack:
    queue: str
    repeat: Repeat
    side: redis.Redis
    worker: subprocess.Popen[bytes]
    log: Path
    notes: str  # the list the task notes its runs in

    def started(self) -> list[str]:
        """The ids of the runs started, in order."""
        return [json.loads(raw)["id"] for raw in self.side.lrange(self.notes, 0, -1)]

    def revoked_early(self, ident: str) -> None:
        """Assert the run `ident` ended `revoked`, long before it would have ended."""
        ended = {e.id: e for e in self.repeat.history(self.queue, "long", n=20)}[ident]
        assert ended.status == "revoked", (ended, self.log.read_text(errors="replace")[-3000:])
        assert ended.started_ms is not None and ended.finished_ms is not None
        assert ended.finished_ms - ended.started_ms < (LONG_S / 2) * 1000


@contextmanager
def replace_schedule(
    redis_url: str, app_dir: Path, prefix: str, *, remote_control: bool
) -> Iterator[Stack]:
    """A one-process prefork worker, a `replace` schedule of `ws.long` every EVERY_S, and a
    pump for the block; the worker stopped after."""
    queue = f"{prefix}-q"
    variables = {
        "WS_BROKER": redis_url,
        "WS_PREFIX": prefix,
        "WS_QUEUE": queue,
        "WS_REMOTE_CONTROL": "1" if remote_control else "0",
    }
    worker, log = celery_worker(app_dir, "ws_app", queue, variables, concurrency=1)
    try:
        wait_until(lambda: b"ready." in log.read_bytes(), 60, "the worker's start")
        repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
        repeat.register(
            queue, "long", every=f"{EVERY_S}s", overlap="replace", template={"task": "ws.long"}
        )
        with celery_pump(repeat, queue, redis_url):
            side = redis.Redis.from_url(redis_url)
            yield Stack(queue, repeat, side, worker, log, f"{prefix}:notes")
    finally:
        stop(worker)


def test_a_run_replaced_while_its_worker_shuts_down_is_terminated_and_reported_revoked(
    redis_url: str, app_dir: Path, prefix: str
) -> None:
    with replace_schedule(redis_url, app_dir, prefix, remote_control=True) as stack:
        wait_until(lambda: len(stack.started()) >= 1, 30, "the first run's start")
        (first,) = stack.started()
        stack.worker.send_signal(signal.SIGTERM)  # a warm shutdown: it finishes its task
        stopping = time.monotonic()
        # The next slot replaces the run; its revoke does not reach a worker shutting down.
        wait_until(lambda: fired(stack.repeat, stack.queue) >= 2, 2 * EVERY_S + 5, "a slot")
        # The run is terminated at a heartbeat of it, and the worker exits: long before the
        # run would have ended.
        wait_until(
            lambda: stack.worker.poll() is not None,
            EVERY_S + 10 * HEARTBEAT_S + 10,
            "the worker's exit, its replaced run terminated",
        )
        assert time.monotonic() - stopping < LONG_S / 2
        stack.revoked_early(first)
        output = stack.log.read_text(errors="replace")
        assert "replaced by a newer occurrence" in output, output[-3000:]


def test_a_worker_without_remote_control_terminates_the_run_a_replace_took_over(
    redis_url: str, app_dir: Path, prefix: str
) -> None:
    with replace_schedule(redis_url, app_dir, prefix, remote_control=False) as stack:
        # Each slot's run is terminated once the next one took over, so the one process of
        # the pool runs the next: three runs started within a few slots, not one a minute.
        wait_until(
            lambda: len(stack.started()) >= 3,
            4 * EVERY_S + 10 * HEARTBEAT_S + 10,
            "three runs, each replaced by the next",
        )
        for ident in stack.started()[:2]:
            stack.revoked_early(ident)
        assert stack.worker.poll() is None, "the worker keeps running"
        assert "replaced by a newer occurrence" in stack.log.read_text(errors="replace")
