"""A Celery task's relative `expires` counts from the claim on the Redis server's clock, not
from the pump host's (found by a clocks probe, session 30).

Celery dates `options={"expires": 60}` by the clock of the host that sends the task
(`AMQP.as_task_v2`: its `now()` plus the seconds) and a worker compares that instant with its
own clock. A beat whose host clock was 90 s behind the server sent tasks that had expired
60 s before they left: a correct-clock worker revoked every one, and nothing ran, where
docs/guarantees.md promises that the host clocks of pumps do not matter. Now the dispatcher
sends the instant the claim's server time (`Occurrence.released_ms`) plus the seconds, on the
default path and the pipelined one (`emq_bridge_pipelined`), and RabbitMQ's AMQP
`expiration` stays the seconds themselves (a TTL the broker counts).

The beat's clock is shifted by a `sitecustomize` on its `PYTHONPATH` (`time.time` and
`datetime.now` move, `time.monotonic` does not, as on a host whose wall clock is off).
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
import skewed_clock
from celery import Celery
from kombu import Connection
from processes import stop, wait_until

from emq_bridge import HistoryEntry, Occurrence, Repeat
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher
from emq_bridge.celery.expiry import expires_in_ms

BEHIND_S = -90  # the beat's clock, against the server's (and the worker's)
EXPIRES_S = 60
RUNS = 3  # slots that must run before the beat stops
T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z

SKEW = skewed_clock.FIXED_OFFSET

APP = (
    textwrap.dedent("""
    import os
    import time

    from celery import Celery

    import emq_bridge.celery  # the worker reports outcomes

    app = Celery("s30exp")
    app.conf.update(
        broker_url=os.environ["S30_URL"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        beat_scheduler="emq_bridge.celery:RepeatScheduler",
        emq_bridge_redis_url=os.environ["S30_URL"],
        emq_bridge_prefix=os.environ["S30_PREFIX"],
        emq_bridge_pipelined=os.environ["S30_PIPELINED"] == "1",
        task_default_queue=os.environ["S30_QUEUE"],
        timezone="UTC",
        beat_schedule={
            "tick": {"task": "s30exp.tick", "schedule": 1.0, "options": {"expires": %d}},
        },
    )
    if os.environ.get("S30_CLOCK_FILE"):  # what this process's clock reads, for the test
        with open(os.environ["S30_CLOCK_FILE"], "w") as f:
            f.write(repr(time.time()))

    @app.task(name="s30exp.tick")
    def tick():
        return None
""")
    % EXPIRES_S
)


def celery_process(
    app_dir: Path, env: dict[str, str], log: Path, *args: str
) -> subprocess.Popen[bytes]:
    """`celery -A s30exp ARGS` in `app_dir`, its log (stderr) in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "s30exp", *args],
            cwd=app_dir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def finished(repeat: Repeat, queue: str) -> list[HistoryEntry]:
    return [e for e in repeat.history(queue, "tick") if e.status != "running"]


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_beat_whose_clock_is_behind_sends_expires_tasks_a_worker_runs(
    redis_url: str, prefix: str, tmp_path: Path, pipelined: bool
) -> None:
    (tmp_path / "s30exp.py").write_text(APP)
    (tmp_path / "skew").mkdir()
    (tmp_path / "skew" / "sitecustomize.py").write_text(SKEW)
    queue = f"{prefix}-q"
    env = {
        **os.environ,
        "S30_URL": redis_url,
        "S30_PREFIX": prefix,
        "S30_QUEUE": queue,
        "S30_PIPELINED": "1" if pipelined else "0",
        "PYTHONPATH": str(tmp_path),
    }
    clock_file = tmp_path / "beat_clock"
    beat_env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "skew"), str(tmp_path)]),
        "CLOCK_OFFSET_S": str(BEHIND_S),
        "S30_CLOCK_FILE": str(clock_file),
    }
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    worker_args = ["worker", "-P", "solo", "-Q", queue, "-l", "info"]
    worker_args += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    worker = celery_process(tmp_path, env, tmp_path / "worker.log", *worker_args)
    beat_args = ["beat", "-l", "info", "--pidfile="]
    beat = celery_process(tmp_path, beat_env, tmp_path / "beat.log", *beat_args)

    def log_tail() -> str:
        statuses = [e.status for e in repeat.history(queue, "tick")]
        tails = {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in ("beat", "worker")}
        return f"history {statuses}; logs: {tails}"

    try:
        wait_until(lambda: clock_file.exists() and clock_file.read_text(), 30, "the beat's start")
        offset = float(clock_file.read_text()) - time.time()
        assert abs(offset - BEHIND_S) < 10, offset  # the beat's clock is behind
        wait_until(
            lambda: len(finished(repeat, queue)) >= RUNS,
            90,
            f"{RUNS} slots reported",
            then=log_tail,
        )
        stop(beat)
        # What was sent before the beat stopped is reported too (run, or revoked).
        wait_until(
            lambda: all(e.status != "running" for e in repeat.history(queue, "tick")),
            30,
            "every slot sent to be reported",
            then=log_tail,
        )
    finally:
        stop(beat)
        stop(worker)
    history = repeat.history(queue, "tick")
    assert len(history) >= RUNS
    # Every slot ran: none was revoked as expired on arrival.
    assert [e.status for e in history] == ["succeeded"] * len(history), log_tail()


# -- what the message carries -----------------------------------------------------------------


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("s30exp-test", broker=redis_url)
    app.conf.update(result_backend=None)
    yield app
    app.close()


def occurrence(queue: str, options: dict[str, Any], released_ms: int) -> Occurrence:
    template = {"task": "s30exp.tick", "options": options}
    return Occurrence(queue, "tick", T0, str(uuid.uuid4()), template, released_ms=released_ms)


def sent(client: redis.Redis, queue: str) -> dict[str, Any]:
    [raw] = client.lrange(queue, 0, -1)
    client.delete(queue)
    message: dict[str, Any] = json.loads(raw)
    return message


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_relative_expires_is_the_claims_server_time_plus_its_seconds(
    app: Celery, client: redis.Redis, pipelined: bool
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    released_ms = T0 + 123  # the claim, on the server's clock: far from this host's now
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    relative = occurrence(queue, {"expires": 2.5}, released_ms)
    absolute = occurrence(queue, {"expires": "2031-01-01T00:00:00+00:00"}, released_ms)
    try:
        assert dispatcher.dispatch_batch([relative]) == [None]
        message = sent(client, queue)
        assert message["headers"]["expires"] == "2030-03-17T00:00:02.623000+00:00"
        assert message["properties"]["expiration"] == "2500"  # the broker's TTL: the seconds
        # The pump's start-timeout bound counts the same time from the same claim.
        assert released_ms + (expires_in_ms(relative.template) or 0) == T0 + 2_623
        assert dispatcher.dispatch_batch([absolute]) == [None]
        assert sent(client, queue)["headers"]["expires"] == "2031-01-01T00:00:00+00:00"
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()


def sent_to_rabbitmq(rabbitmq_url: str, options: dict[str, Any], released_ms: int) -> Any:
    """The message `CeleryDispatcher` sends to RabbitMQ for an occurrence with `options`."""
    queue = f"s30exp-{uuid.uuid4().hex[:8]}"
    app = Celery("s30exp-rabbit", broker=rabbitmq_url)
    app.conf.update(result_backend=None, task_default_queue=queue)
    try:
        with Connection(rabbitmq_url) as connection:
            channel = connection.default_channel
            channel.queue_declare(queue, durable=True, auto_delete=False)
            try:
                CeleryDispatcher(app).dispatch(occurrence(queue, options, released_ms))
                # The publish went on the app's own connection: the broker routes it to the
                # queue a moment later, which this channel's basic_get may come before.
                message = None
                deadline = time.monotonic() + 10
                while message is None and time.monotonic() < deadline:
                    message = channel.basic_get(queue, no_ack=True)
                    if message is None:
                        time.sleep(0.05)
            finally:
                channel.queue_delete(queue)
    finally:
        app.close()
    assert message is not None
    return message


def test_rabbitmq_expiration_stays_the_seconds(rabbitmq_url: str) -> None:
    message = sent_to_rabbitmq(rabbitmq_url, {"expires": 60}, T0)
    assert message.headers["expires"] == "2030-03-17T00:01:00.000000+00:00"
    assert message.properties["expiration"] == "60000"


# -- session 31: an absolute `expires`, and the task's own default ---------------------------
#
# Celery makes the AMQP `expiration` of an absolute `expires` (an ISO 8601 instant) the time
# left by the sending host's clock (`Celery.send_task`): a pump 90 s ahead of the server gave
# RabbitMQ a TTL 90 s short. And a task declared `@app.task(expires=60)` takes that default
# in `Task.apply_async`, which the dispatcher did not see, so it was dated by the host's
# clock. Both now count from the claim's server time; a template's own `expires`, None
# included, still wins over the task's, as in Celery.

ABSOLUTE = "2030-03-17T00:01:00+00:00"  # 60 s after T0; the claim, below, 0.123 s after it


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_an_absolute_expires_keeps_its_instant_and_its_ttl_counts_from_the_claim(
    app: Celery, client: redis.Redis, pipelined: bool
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    try:
        assert dispatcher.dispatch_batch([occurrence(queue, {"expires": ABSOLUTE}, T0 + 123)]) == [
            None
        ]
        message = sent(client, queue)
        assert message["headers"]["expires"] == ABSOLUTE  # as given
        # 60 s after T0, the claim 0.123 s after T0: not the years from this host's now.
        assert message["properties"]["expiration"] == "59877"
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_the_tasks_own_expires_counts_from_the_claim(
    app: Celery, client: redis.Redis, pipelined: bool
) -> None:
    @app.task(name="s30exp.tick", expires=2.5, shared=False)
    def tick() -> None:
        return None

    queue = f"q{uuid.uuid4().hex[:8]}"
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    try:
        assert dispatcher.dispatch_batch([occurrence(queue, {}, T0 + 123)]) == [None]
        message = sent(client, queue)
        assert message["headers"]["expires"] == "2030-03-17T00:00:02.623000+00:00"
        assert message["properties"]["expiration"] == "2500"
        # The pump's start-timeout bound sees it too.
        assert dispatcher.expiry_ms({"task": "s30exp.tick", "options": {}}) == 2500
        # The template's own `expires` wins, None included, as in `Task.apply_async`.
        assert dispatcher.dispatch_batch([occurrence(queue, {"expires": 10}, T0 + 123)]) == [None]
        assert sent(client, queue)["headers"]["expires"] == "2030-03-17T00:00:10.123000+00:00"
        assert dispatcher.dispatch_batch([occurrence(queue, {"expires": None}, T0)]) == [None]
        assert sent(client, queue)["headers"]["expires"] is None
        unset = {"task": "s30exp.tick", "options": {"expires": None}}
        assert dispatcher.expiry_ms(unset) is None
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()


def test_rabbitmq_gets_the_ttl_left_at_the_claim(rabbitmq_url: str) -> None:
    message = sent_to_rabbitmq(rabbitmq_url, {"expires": ABSOLUTE}, T0 + 123)
    assert message.headers["expires"] == ABSOLUTE
    assert message.properties["expiration"] == "59877"
