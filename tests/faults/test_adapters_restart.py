"""Redis restarts under the adapters: Celery's beat scheduler and Dramatiq's middleware.

The server (AOF on) is SIGKILLed while the adapter pumps, stays down for a few seconds and
is restarted on the same port and directory. The adapter must log the outage once (not a
line per tick), reconnect, and send occurrences again; no registration is lost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge.embedded import EmbeddedServer

from .conftest import free_port

pytestmark = pytest.mark.faults

OUTAGE_S = 3.0


@pytest.fixture
def aof_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(
        port=free_port(),
        directory=str(tmp_path),
        extra_args=["--appendonly", "yes", "--appendfsync", "everysec"],
    ).start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("emq_bridge")
        and r.levelno >= logging.WARNING
        and "unreachable" in r.getMessage()
    ]


def celery_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    found = []
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        found += [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    return found


def noop() -> None:
    """The task the beat sends (it never runs here: the test reads the broker's queue)."""


def test_celery_beat_rides_out_a_redis_restart_logging_the_outage_once(
    aof_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import Celery

    from emq_bridge.celery import RepeatScheduler

    caplog.set_level(logging.INFO, logger="emq_bridge")
    app = Celery("restart", broker=aof_server.url, set_as_current=False)
    app.conf.update(
        task_default_queue="beat-q",
        beat_schedule={"tick": {"task": "t.tick", "schedule": 0.5}},
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
    )
    app.task(name="t.tick", shared=False)(noop)
    scheduler = RepeatScheduler(app)
    client = redis.Redis.from_url(aof_server.url)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            stop.wait(min(scheduler.tick(), 0.5))

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: len(celery_messages(client, "beat-q")) >= 2, 20, "two beats before the crash"
        )
        aof_server.kill()
        time.sleep(OUTAGE_S)
        aof_server.start()
        sent = len(celery_messages(client, "beat-q"))
        wait_for(
            lambda: len(celery_messages(client, "beat-q")) > sent + 1, 30, "beats after the restart"
        )
    finally:
        stop.set()
        thread.join(15)
        scheduler.close()
        app.close()
        client.close()
    assert 1 <= len(outage_lines(caplog)) <= 2, outage_lines(caplog)


def test_the_dramatiq_middleware_pump_rides_out_a_redis_restart_logging_the_outage_once(
    aof_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, current_occurrence, recurring

    caplog.set_level(logging.INFO, logger="emq_bridge")
    broker = RedisBroker(url=aof_server.url)
    broker.add_middleware(RecurringMiddleware(source="restart", lease_ms=2_000, max_sleep_s=0.5))
    seen: list[int] = []

    @recurring(every="500ms")
    @dramatiq.actor(queue_name="dq", broker=broker)
    def heartbeat() -> None:
        occurrence = current_occurrence()
        assert occurrence is not None
        seen.append(occurrence.due_ms)

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        wait_for(lambda: len(seen) >= 2, 20, "two heartbeats before the crash")
        aof_server.kill()
        time.sleep(OUTAGE_S)
        aof_server.start()
        restarted_ms = int(time.time() * 1000)
        wait_for(
            lambda: any(due > restarted_ms for due in seen), 40, "a heartbeat due after the restart"
        )
    finally:
        worker.stop()
        broker.close()
    assert 1 <= len(outage_lines(caplog)) <= 2, outage_lines(caplog)
    client = redis.Redis.from_url(aof_server.url)
    from emq_bridge import Repeat

    assert [r.name for r in Repeat(client, "emq").list("dq")] == ["heartbeat"]
    client.close()
