"""A registry outage of seconds no longer freezes an `overlap="skip"` schedule (chaos soak).

The pump sends a guarded occurrence (the registry keeps it in flight); the registry goes
down before the worker starts it, so the worker's overlap check fails and the task runs
unguarded. Its start and final reports met the outage and were dropped: the registry kept
the occurrence in flight (no heartbeat ever started, so never lost) and skipped every later
slot until the start timeout, 10 minutes. Now the reporter keeps them and sends them once
the registry is back: the run is in the history, its in-flight marker is cleared and the
schedule runs again within seconds.

The outage must begin between the send and the worker's check, a window of milliseconds.
So the test app puts a middleware ahead of `RecurringMiddleware` that, once the test asks
(a key), shuts the registry down in `before_process_message` of the next guarded message
and returns only when its port refuses connections: the check that follows it in the same
hook chain always meets the outage, whatever the timing of the pump or the machine's load.
The registry is a server of the test's own with AOF (fsync always), started again on the
same port and directory after 3 s, its data kept, as a short restart does.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

OUTAGE_S = 3.0
# The pump in the worker backs off while the registry is down (it noticed it back about 11 s
# after a 3 s outage in the soak); the reports wait at most 5 s between tries. Far below the
# 10 minutes the schedule stayed frozen.
BACK_WITHIN_S = 45.0

APP = textwrap.dedent("""
    import json
    import os
    import socket
    import time

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import Middleware

    from emq_bridge.dramatiq import RecurringMiddleware, current_occurrence, recurring

    env = os.environ
    P = env["S29_PREFIX"]
    notes = redis.Redis.from_url(env["S29_BROKER"])


    class RegistryStop(Middleware):
        # Ahead of RecurringMiddleware: when the test asks, the registry goes down before
        # this message's overlap check, which then fails (the task runs unguarded).
        def before_process_message(self, broker, message):
            if message.actor_name != "guarded" or not notes.delete(f"{P}:stop-registry"):
                return
            redis.Redis.from_url(env["S29_REGISTRY"]).shutdown()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", int(env["S29_PORT"])), 0.2).close()
                except OSError:
                    break
                time.sleep(0.01)
            notes.set(f"{P}:stopped-for", message.message_id)


    broker = RedisBroker(url=env["S29_BROKER"], namespace=env["S29_NAMESPACE"])
    broker.add_middleware(RegistryStop())
    broker.add_middleware(
        RecurringMiddleware(env["S29_REGISTRY"], prefix=P, source=P, max_sleep_s=0.5)
    )
    dramatiq.set_broker(broker)


    @recurring(every=1, overlap="skip")
    @dramatiq.actor(queue_name=env["S29_QUEUE"], max_retries=0)
    def guarded():
        occurrence = current_occurrence()
        notes.rpush(f"{P}:runs", json.dumps({"id": occurrence.id, "due_ms": occurrence.due_ms}))
        time.sleep(0.3)
""")


class Worker:
    """The test app module and the `dramatiq` command running it (one process, 2 threads)."""

    def __init__(self, root: Path, broker_url: str, registry: EmbeddedServer) -> None:
        token = uuid.uuid4().hex[:8]
        self.prefix, self.queue = f"s29{token}", f"q{token}"
        self.namespace, self.module = f"ns{token}", f"s29_app_{token}"
        (root / f"{self.module}.py").write_text(APP)
        self.log_path = root / "worker.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
            "S29_BROKER": broker_url,
            "S29_REGISTRY": registry.url,
            "S29_PORT": str(registry.port),
            "S29_PREFIX": self.prefix,
            "S29_QUEUE": self.queue,
            "S29_NAMESPACE": self.namespace,
        }
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dramatiq", self.module, "--path", str(root)),
                    *("--processes", "1", "--threads", "2"),
                ],
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, to kill it with its children
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A registry of this test's own whose data survives a shutdown (AOF, fsync always)."""
    directory = tmp_path / "registry"
    directory.mkdir()
    server = EmbeddedServer(
        directory=str(directory), extra_args=["--appendonly", "yes", "--appendfsync", "always"]
    ).start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, worker: Worker) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if worker.process.poll() is not None:
            raise AssertionError(f"the worker exited: {worker.log()[-3000:]}")
        try:
            found = check()
        except redis.RedisError:  # the registry is down or loading
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s\n{worker.log()[-4000:]}")
        time.sleep(0.05)


def registry_exited(registry: EmbeddedServer) -> bool:
    return registry.process is not None and registry.process.poll() is not None


def runs(client: redis.Redis, worker: Worker) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(f"{worker.prefix}:runs", 0, -1)]


def clean(client: redis.Redis, worker: Worker) -> None:
    for pattern in (f"{worker.namespace}:*", f"{worker.prefix}:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


def test_a_skip_schedule_runs_again_soon_after_an_outage_its_unguarded_run_met(
    tmp_path: Path, redis_url: str, client: redis.Redis, registry: EmbeddedServer
) -> None:
    worker = Worker(tmp_path, redis_url, registry)
    repeat = Repeat(redis.Redis.from_url(registry.url, socket_timeout=2), worker.prefix)
    try:
        wait_for(lambda: len(runs(client, worker)) >= 2, 30, "two runs before", worker)

        client.set(f"{worker.prefix}:stop-registry", 1)  # the next guarded message stops it
        wait_for(lambda: registry_exited(registry), 15, "the registry's shutdown", worker)
        stopped_at = time.monotonic()
        registry.kill()  # reaps the exited server; its directory is kept
        unguarded = wait_for(
            lambda: client.get(f"{worker.prefix}:stopped-for"), 10, "the stop", worker
        ).decode()
        wait_for(
            lambda: [r for r in runs(client, worker) if r["id"] == unguarded],
            10,
            "the unguarded run",
            worker,
        )
        time.sleep(max(0.0, stopped_at + OUTAGE_S - time.monotonic()))
        registry.start()
        back_ms = time.time() * 1000

        # Its reports were kept, and sent once the registry was back.
        (entry,) = wait_for(
            lambda: [
                e
                for e in repeat.history(worker.queue, "guarded", 50)
                if e.id == unguarded and e.status == "succeeded"
            ],
            BACK_WITHIN_S,
            "the unguarded run in the history",
            worker,
        )
        assert entry.started_ms is not None and entry.finished_ms is not None
        # The schedule runs again: a slot after the outage.
        wait_for(
            lambda: [r for r in runs(client, worker) if r["due_ms"] > back_ms],
            BACK_WITHIN_S,
            "a run of a slot after the outage",
            worker,
        )
        registration = repeat.get(worker.queue, "guarded")
        assert registration is not None
        assert registration.inflight != f"guarded {entry.due_ms}"  # its marker is cleared

        log = worker.log()
        assert "an occurrence was run unguarded: its overlap check failed" in log, log[-4000:]
        assert log.count("occurrence reports wait until Redis takes them again") == 1, log[-4000:]
        assert "occurrence reports reach Redis again; " in log, log[-4000:]
        assert "occurrence reports are dropped" not in log, log[-4000:]
    finally:
        worker.stop()
        repeat.close()
        clean(client, worker)
