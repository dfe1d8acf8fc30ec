"""A poison template through real processes: `celery beat -S emq`, a `dramatiq` worker
with the RecurringMiddleware pump thread, and `emq-bridge pump`.

A registration whose record's `template` was overwritten by hand (HSET, as an attacker or a
bug would; the API refuses it) with JSON nested far deeper than `MAX_TEMPLATE_DEPTH` sits
beside a healthy one on the same queue. The process must stay up, keep sending the healthy
one, park the poison for 60 s (its score moves ahead) and log that once, without a
traceback (docs/guarantees.md: "no record can stop a pump").
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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.pump import CORRUPT_PARK_MS

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

# 600 is past what a recursive walk survives (about 2 frames a level against a limit of
# 1000) but still decodes with `json`; 5,000 is past what `json` itself can decode.
DEPTHS = [600, 5_000]
POISON = "poison"
HEALTHY = "healthy"
FIRES = 3  # healthy occurrences to see sent; it fires every second
WAIT_S = 20.0

CELERY_APP = textwrap.dedent("""
    import os

    from celery import Celery

    env = os.environ
    app = Celery("poison", broker=env["POISON_REDIS"])
    app.conf.update(
        emq_bridge_prefix=env["POISON_PREFIX"],
        task_default_queue=env["POISON_QUEUE"],
        beat_schedule={"healthy": {"task": "poison.noop", "schedule": 1.0}},
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
    )


    @app.task(name="poison.noop")
    def noop():
        return None
""")

DRAMATIQ_APP = textwrap.dedent("""
    import os

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, current_occurrence, recurring

    env = os.environ
    broker = RedisBroker(url=env["POISON_REDIS"], namespace=env["POISON_NAMESPACE"])
    broker.add_middleware(RecurringMiddleware(prefix=env["POISON_PREFIX"], max_sleep_s=0.5))
    dramatiq.set_broker(broker)
    results = redis.Redis.from_url(env["POISON_REDIS"])


    @recurring(every="1s")
    @dramatiq.actor(queue_name=env["POISON_QUEUE"])
    def healthy():
        results.rpush(env["POISON_PREFIX"] + ":ran", current_occurrence().name)
""")


def deep_template(depth: int) -> str:
    return '{"task":"t","args":' + "[" * depth + "]" * depth + "}"


def plant_poison(client: redis.Redis, prefix: str, queue: str, depth: int) -> None:
    """Register `poison` (due at once, every second), then overwrite its template by hand."""
    repeat = Repeat(client, prefix)
    now_ms = repeat.server_time_ms()
    repeat.register(queue, POISON, every_ms=1_000, template={"task": "t"}, now_ms=now_ms - 1_000)
    client.hset(repeat.keys(queue).record(POISON), "template", deep_template(depth))


def park_lines(log: Path, queue: str) -> list[str]:
    return [line for line in read(log).splitlines() if f"{queue}/{POISON}: parked for" in line]


def read(log: Path) -> str:
    return log.read_text(errors="replace")


def tail(log: Path) -> str:
    """The end of a process's output, and how many tracebacks it holds (one a line or not)."""
    lines = [line[:300] for line in read(log).splitlines() if line.strip()]
    tracebacks = sum("Traceback" in line for line in lines)
    return f"{tracebacks} traceback(s) in {len(lines)} lines; it ends:\n" + "\n".join(lines[-8:])


class Names:
    """A test's own prefix, queue and directory, and the environment of its processes."""

    def __init__(self, tmp_path: Path, server: EmbeddedServer) -> None:
        token = uuid.uuid4().hex[:10]
        self.prefix = f"pt{token}"
        self.queue = f"pq{token}"
        self.dir = tmp_path
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p
            ),
            "POISON_REDIS": server.url,
            "POISON_PREFIX": self.prefix,
            "POISON_QUEUE": self.queue,
            "POISON_NAMESPACE": f"pn{token}",
        }


@pytest.fixture
def names(tmp_path: Path, own_server: EmbeddedServer) -> Names:
    return Names(tmp_path, own_server)


def assert_parked(client: redis.Redis, names: Names) -> None:
    """The poison is due again about `CORRUPT_PARK_MS` from now, by the server's clock."""
    score = client.zscore(Repeat(client, names.prefix).keys(names.queue).registry, POISON)
    assert score is not None, "the poison registration is gone from the registry"
    seconds, micros = client.time()
    ahead_ms = score - (int(seconds) * 1000 + int(micros) // 1000)
    # The test's own seconds have run off the park already.
    assert CORRUPT_PARK_MS - 15_000 < ahead_ms <= CORRUPT_PARK_MS + 1_000, ahead_ms


@contextmanager
def running(command: list[str], names: Names, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` with its output in `log`; SIGTERM it (then SIGKILL) however the test ends."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            cwd=names.dir,
            env=names.env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def wait_while_alive(
    condition: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, what: str
) -> None:
    """Poll `condition` until it holds; fail at once if `process` exits, or after `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            raise AssertionError(
                f"the process exited (rc {process.returncode}) before {what}:\n{tail(log)}"
            )
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {WAIT_S}s:\n{tail(log)}")


def assert_survived(
    process: subprocess.Popen[bytes], client: redis.Redis, names: Names, log: Path
) -> None:
    """Alive, the poison parked about 60 s ahead, one error line for it and no traceback."""
    assert process.poll() is None, f"the process exited (rc {process.returncode}):\n{tail(log)}"
    assert_parked(client, names)
    lines = park_lines(log, names.queue)
    assert len(lines) == 1 and "corrupt record" in lines[0], lines or tail(log)
    assert "Traceback" not in read(log), tail(log)


def celery_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in a Celery Redis-broker queue (priority sub-lists included)."""
    found = []
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        found += [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    return found


@pytest.mark.parametrize("depth", DEPTHS)
def test_celery_beat_keeps_sending_the_healthy_task_beside_a_poison_template_and_parks_it(
    names: Names, own_client: redis.Redis, depth: int
) -> None:
    (names.dir / "poison_app.py").write_text(CELERY_APP)
    plant_poison(own_client, names.prefix, names.queue, depth)
    log = names.dir / "beat.log"
    command = [sys.executable, "-m", "celery", "-A", "poison_app", "beat", "-S", "emq"]
    command += ["--loglevel", "INFO", "--pidfile=", f"--schedule={names.dir / 'beat.db'}"]

    with running(command, names, log) as beat:
        wait_while_alive(
            lambda: len(celery_messages(own_client, names.queue)) >= FIRES,
            beat,
            log,
            f"{FIRES} healthy messages on the broker",
        )
        assert_survived(beat, own_client, names, log)
        messages = celery_messages(own_client, names.queue)

    assert {m["headers"]["emq_schedule"] for m in messages} == {f"{names.queue}/{HEALTHY}"}
    assert {m["headers"]["task"] for m in messages} == {"poison.noop"}


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_dramatiq_worker_keeps_running_the_healthy_actor_beside_a_poison_template_and_parks_it(
    names: Names, own_client: redis.Redis, depth: int
) -> None:
    module = f"poison_app_{names.prefix}"
    (names.dir / f"{module}.py").write_text(DRAMATIQ_APP)
    plant_poison(own_client, names.prefix, names.queue, depth)
    log = names.dir / "worker.log"
    command = [sys.executable, "-m", "dramatiq", module, "--path", str(names.dir)]
    command += ["--processes", "1", "--threads", "1"]
    ran = f"{names.prefix}:ran"

    with running(command, names, log) as worker:
        wait_while_alive(
            lambda: own_client.llen(ran) >= FIRES, worker, log, f"{FIRES} healthy runs"
        )
        assert_survived(worker, own_client, names, log)

    assert set(own_client.lrange(ran, 0, -1)) == {HEALTHY.encode()}


def pump_command(names: Names, server: EmbeddedServer, *extra: str) -> list[str]:
    """`emq-bridge pump QUEUE --list-key KEY`, as `python -m emq_bridge` (this interpreter)."""
    return [
        *(sys.executable, "-m", "emq_bridge", "--redis-url", server.url),
        *("--prefix", names.prefix),
        "pump",
        names.queue,
        "--list-key",
        f"{names.prefix}:out",
        "--max-sleep",
        "0.2",
        *extra,
    ]


def register_healthy(client: redis.Redis, names: Names) -> None:
    repeat = Repeat(client, names.prefix)
    now_ms = repeat.server_time_ms()
    repeat.register(
        names.queue, HEALTHY, every_ms=1_000, template={"task": "ok"}, now_ms=now_ms - 1_000
    )


def pushed(client: redis.Redis, names: Names) -> list[str]:
    return [json.loads(raw)["name"] for raw in client.lrange(f"{names.prefix}:out", 0, -1)]


@pytest.mark.parametrize("depth", DEPTHS)
def test_the_cli_pump_keeps_pushing_the_healthy_occurrences_beside_a_poison_template(
    names: Names, own_server: EmbeddedServer, own_client: redis.Redis, depth: int
) -> None:
    register_healthy(own_client, names)
    plant_poison(own_client, names.prefix, names.queue, depth)
    log = names.dir / "pump.log"

    with running(pump_command(names, own_server), names, log) as pump:
        wait_while_alive(
            lambda: len(pushed(own_client, names)) >= FIRES,
            pump,
            log,
            f"{FIRES} healthy occurrences on the list",
        )
        assert_survived(pump, own_client, names, log)

    assert set(pushed(own_client, names)) == {HEALTHY}


@pytest.mark.parametrize("depth", DEPTHS)
def test_the_cli_pump_once_sends_the_healthy_occurrence_parks_the_poison_and_exits_0(
    names: Names, own_server: EmbeddedServer, own_client: redis.Redis, depth: int
) -> None:
    register_healthy(own_client, names)
    plant_poison(own_client, names.prefix, names.queue, depth)

    done = subprocess.run(
        pump_command(names, own_server, "--once"),
        cwd=names.dir,
        env=names.env,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode == 0, done.stderr[-1500:]
    assert "dispatched 1, failed 0" in done.stdout, done.stdout
    assert pushed(own_client, names) == [HEALTHY]
    assert_parked(own_client, names)
    lines = [line for line in done.stderr.splitlines() if f"/{POISON}: parked for" in line]
    assert len(lines) == 1 and "corrupt record" in lines[0], done.stderr[-1500:]
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
