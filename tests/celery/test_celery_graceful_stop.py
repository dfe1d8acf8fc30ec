"""SIGTERM to a real `celery beat -S emq` during a burst leaves nothing leased or sent twice.

Celery's beat handles SIGTERM by raising `SystemExit` wherever its main thread is, which
during a burst is inside the scheduler's tick, between a claim and its ack. The beat must
settle the batch in hand (send it and ack it, or hand it back) and exit 0; then a second
pump sends everything left at once, and each occurrence id reaches the broker exactly once.
On a Redis broker a batch is one pipelined publish; on RabbitMQ every message is published
on its own, so an interrupted batch would leave sent but unacked messages to be sent again.
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
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from quiet import quiet_offset

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.definition import define

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BURST = 3_000
HOUR = 3_600_000

APP = textwrap.dedent("""
    import os
    import time

    from celery import Celery
    from celery.signals import before_task_publish

    env = os.environ
    app = Celery("gs", broker=env["GS_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["GS_REDIS"],
        emq_bridge_prefix=env["GS_PREFIX"],
        task_default_queue=env["GS_QUEUE"],
        beat_schedule={},
        result_backend=None,
        result_expires=None,  # no celery.backend_cleanup: a 04:00 run mid-test is one id more
        broker_connection_retry_on_startup=True,
    )


    @before_task_publish.connect
    def slow_publish(**_):  # 2 ms a message: most of a batch's time is spent sending it
        time.sleep(0.002)
""")


class Broker:
    """One broker the beat and the test's second pump publish to, and how to read it."""

    def __init__(self, url: str, read: Callable[[str], list[str]], clean: Callable[[str], None]):
        self.url = url
        self.read = read  # queue -> the task ids published to it (consumed, for RabbitMQ)
        self.clean = clean


def redis_broker(redis_url: str) -> Broker:
    client = redis.Redis.from_url(redis_url)

    def read(queue: str) -> list[str]:
        return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]

    def clean(queue: str) -> None:
        client.delete(queue)

    return Broker(redis_url, read, clean)


def amqp_broker(url: str) -> Broker:
    from kombu import Connection

    def read(queue: str) -> list[str]:
        ids = []
        with Connection(url) as connection:
            channel = connection.default_channel
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                ids.append(message.headers["id"])
        return ids

    def clean(queue: str) -> None:
        with Connection(url) as connection:
            connection.default_channel.queue_delete(queue)

    return Broker(url, read, clean)


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, redis_url: str) -> Broker:
    if request.param == "redis":
        return redis_broker(redis_url)
    return amqp_broker(request.getfixturevalue("rabbitmq_url"))


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "gs_app.py").write_text(APP)
    yield tmp_path


def test_sigterm_to_a_beat_during_a_burst_leaves_nothing_leased_and_sends_each_id_once(
    broker: Broker, app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    # Due now, the next slot far off: a top of the hour mid-test would send the burst again.
    definition = define(every="1h", offset=quiet_offset(), template={"task": "gs.noop"})
    now = repeat.server_time_ms()
    repeat.upsert_many([(queue, f"r{i:05d}", definition) for i in range(BURST)], now_ms=now - HOUR)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(app_dir), os.environ.get("PYTHONPATH")])),
        "GS_BROKER": broker.url,
        "GS_REDIS": redis_url,
        "GS_PREFIX": prefix,
        "GS_QUEUE": queue,
    }
    log = app_dir / "beat.log"
    try:
        with log.open("wb") as out:
            beat = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "gs_app", "beat", "-S", "emq"),
                    *("--pidfile=", f"--schedule={app_dir / 'beat.db'}", "-l", "info"),
                ],
                cwd=app_dir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            # Its first messages: the burst's first batch is in, the next ones are in hand.
            deadline = time.monotonic() + 60
            while "Scheduler: Sending due task" not in log.read_text(errors="replace"):
                assert beat.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, "the beat sent nothing in 60 s"
                time.sleep(0.005)
            beat.send_signal(signal.SIGTERM)
            code = beat.wait(timeout=30)
        finally:
            if beat.poll() is None:
                beat.kill()
                beat.wait()
        output = log.read_text(errors="replace")
        assert code == 0, output
        sent_by_beat = sum("Scheduler: Sending due task" in line for line in output.splitlines())
        assert 0 < sent_by_beat < BURST, output[-2000:]
        left = [lease for lease in repeat.leases(queue) if lease[2] > repeat.server_time_ms()]
        assert left == [], f"{len(left)} occurrence(s) wait out their lease"

        second = Celery("second", broker=broker.url)
        second.conf.update(result_backend=None, task_default_queue=queue)
        pump = Pump(repeat, [queue], CeleryDispatcher(second), batch_size=BURST)
        pump.run_once()
        assert repeat.leases(queue) == []
        ids = Counter(broker.read(queue))
        twice = [i for i, n in ids.items() if n > 1]
        assert twice == [], f"{len(twice)} occurrence(s) sent twice"
        assert len(ids) == BURST
    finally:
        broker.clean(queue)
