"""Real `celery beat` and `celery worker` processes on real brokers.

One module-wide fleet runs at once, so the whole file waits for a single crontab minute:

* Redis broker (the test Redis): three beats started three ways (`-S <path>`, `-S emq`,
  `app.conf.beat_scheduler`) and one worker, with an every-1 s entry and a minutely crontab;
* Redis broker: one beat that is stopped and started again mid-run (every-3 s entry);
* RabbitMQ broker (registry in Redis): `worker -B --scheduler ...` plus a second beat;
* probes: beats started on bad input, and workers whose boot-time sync succeeds or fails.

Each task RPUSHes its task id and headers to a Redis list; assertions read that list.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat, occurrence_id

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

APP = textwrap.dedent("""
    import json, os
    import redis
    from celery import Celery
    from celery.schedules import crontab

    env = os.environ
    app = Celery("emqt", broker=env["EMQT_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["EMQT_REDIS"],
        emq_bridge_prefix=env["EMQT_PREFIX"],
        task_default_queue=env["EMQT_QUEUE"],
        timezone="Europe/Paris",
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
    )
    if env.get("EMQT_CONF_SCHEDULER"):
        app.conf.beat_scheduler = "emq_bridge.celery:RepeatScheduler"
    SCHEDULES = {
        "main": {
            "tick": {"task": "emqt.record", "schedule": 1.0, "args": ["tick"]},
            "minutely": {"task": "emqt.record", "schedule": crontab(), "args": ["minutely"]},
        },
        "restart": {"pulse": {"task": "emqt.record", "schedule": 3.0, "args": ["pulse"]}},
        "bad-task": {"x": {"task": "emqt.nope", "schedule": 1.0}},
        "bad-schedule": {"x": {"task": "emqt.record", "schedule": "every second"}},
        "bad-key": {"x": {"task": "emqt.record", "schedule": 1.0, "kwarg": {}}},
    }
    app.conf.beat_schedule = SCHEDULES[env.get("EMQT_SCHEDULE", "main")]
    results = redis.Redis.from_url(env["EMQT_REDIS"])

    @app.task(bind=True, name="emqt.record")
    def record(self, label):
        queue = (self.request.delivery_info or {}).get("routing_key")
        results.rpush(f"{queue}:results", json.dumps({
            "id": self.request.id,
            "label": label,
            "headers": {k: getattr(self.request, k, None)
                        for k in ("emq_due_ms", "emq_schedule", "celery_beat_task")},
            "queue": queue,
        }))

    if env.get("EMQT_DECORATE"):
        from emq_bridge.celery import recurring

        @recurring(every="1h")
        @app.task(name="emqt.hourly")
        def hourly():
            return None
""")


@dataclass
class Stack:
    """One group of processes sharing a prefix, a queue and a result list."""

    prefix: str
    queue: str
    results: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


@dataclass
class Fleet:
    redis_url: str
    tmp: Path
    stacks: dict[str, Stack] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def stack(self, key: str, broker: str, schedule: str = "main", **extra: str) -> Stack:
        prefix = f"t{uuid.uuid4().hex[:10]}"
        env = {
            **os.environ,
            "PYTHONPATH": str(self.tmp),
            "EMQT_BROKER": broker,
            "EMQT_REDIS": self.redis_url,
            "EMQT_PREFIX": prefix,
            "EMQT_QUEUE": f"{prefix}-q",
            "EMQT_SCHEDULE": schedule,
            **extra,
        }
        self.stacks[key] = Stack(prefix, f"{prefix}-q", f"{prefix}-q:results", env)
        return self.stacks[key]

    def start(self, stack: Stack, name: str, *args: str, **extra: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "emqt_app", *args, "-l", "info"],
                cwd=self.tmp,
                env={**stack.env, **extra},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        stack.procs[name] = proc
        return proc

    def beat(
        self, stack: Stack, name: str, *scheduler: str, **extra: str
    ) -> subprocess.Popen[bytes]:
        return self.start(
            stack,
            name,
            "beat",
            *scheduler,
            "--pidfile=",
            f"--schedule={self.tmp / name}.db",
            **extra,
        )

    def worker(
        self, stack: Stack, name: str, *args: str, queues: tuple[str, ...] = (), **extra: str
    ) -> subprocess.Popen[bytes]:
        return self.start(
            stack,
            name,
            "worker",
            "-P",
            "solo",
            "-c",
            "1",
            "-n",
            f"{name}@%h",
            "-Q",
            ",".join(queues or (stack.queue,)),
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            *args,
            **extra,
        )

    def results(self, key: str) -> list[dict[str, Any]]:
        client = redis.Redis.from_url(self.redis_url)
        try:
            return [json.loads(r) for r in client.lrange(self.stacks[key].results, 0, -1)]
        finally:
            client.close()

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def stop_all(self) -> None:
        procs = [p for s in self.stacks.values() for p in s.procs.values() if p.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def labelled(results: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    return [r for r in results if r["label"] == label]


def rabbitmq_reachable() -> bool:
    if "RABBITMQ_URL" in os.environ:
        return True
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


def wait_until(check: Any, timeout_s: float, poll_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return bool(check())


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("celery-fleet")
    (tmp / "emqt_app.py").write_text(APP)
    fleet = Fleet(redis_url, tmp)
    rabbit_url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
    try:
        multi = fleet.stack("multi", redis_url)
        restart = fleet.stack("restart", redis_url, "restart")
        fleet.worker(multi, "redis-worker", queues=(multi.queue, restart.queue))
        fleet.beat(multi, "beat-path", "-S", "emq_bridge.celery:RepeatScheduler")
        fleet.beat(multi, "beat-alias", "-S", "emq")
        fleet.beat(multi, "beat-conf", EMQT_CONF_SCHEDULER="1")
        fleet.beat(restart, "restart-beat-1", "-S", "emq")
        if rabbitmq_reachable():
            rabbit = fleet.stack("rabbit", rabbit_url)
            fleet.worker(
                rabbit, "rabbit-worker-B", "-B", "--scheduler", "emq_bridge.celery:RepeatScheduler"
            )
            fleet.beat(rabbit, "rabbit-beat", "-S", "emq")
        for variant in ("bad-task", "bad-schedule", "bad-key"):
            fleet.beat(fleet.stack(variant, redis_url, variant), variant, "-S", "emq")
        fleet.worker(fleet.stack("boot-ok", redis_url, EMQT_DECORATE="1"), "boot-ok")
        fleet.worker(
            fleet.stack("boot-fail", redis_url, EMQT_DECORATE="1"),
            "boot-fail",
            EMQT_REDIS="redis://127.0.0.1:1/0",
        )
        _drive(fleet)
        yield fleet
    finally:
        fleet.stop_all()
        if "rabbit" in fleet.stacks:
            _delete_rabbit_queue(rabbit_url, fleet.stacks["rabbit"].queue)


def _drive(fleet: Fleet) -> None:
    """Run until every scenario has what it needs; restart the restart stack's beat midway."""
    restarted = False
    stacks = [k for k in ("multi", "rabbit") if k in fleet.stacks]

    def done() -> bool:
        nonlocal restarted
        pulses = labelled(fleet.results("restart"), "pulse")
        if not restarted and len(pulses) >= 2:
            beat = fleet.stacks["restart"].procs["restart-beat-1"]
            beat.send_signal(signal.SIGTERM)
            beat.wait(timeout=20)
            fleet.beat(fleet.stacks["restart"], "restart-beat-2", "-S", "emq")
            restarted = True
            fleet.stacks["restart"].env["EMQT_RESTART_AT"] = str(len(pulses))
        return (
            restarted
            and len(pulses) >= int(fleet.stacks["restart"].env["EMQT_RESTART_AT"]) + 3
            and all(len(labelled(fleet.results(k), "minutely")) >= 1 for k in stacks)
            and all(len(labelled(fleet.results(k), "tick")) >= 5 for k in stacks)
        )

    wait_until(done, timeout_s=150)


def _delete_rabbit_queue(url: str, queue: str) -> None:
    from kombu import Connection

    with Connection(url) as connection:
        connection.default_channel.queue_delete(queue)


def assert_each_occurrence_ran_once(fleet: Fleet, key: str) -> None:
    stack = fleet.stacks[key]
    results = fleet.results(key)
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)), "an occurrence ran twice"
    ticks = sorted(r["headers"]["emq_due_ms"] for r in labelled(results, "tick"))
    assert len(ticks) >= 5
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 1000)), "every 1 s slot runs exactly once"
    for result in results:
        name = "tick" if result["label"] == "tick" else "minutely"
        due = result["headers"]["emq_due_ms"]
        assert result["id"] == occurrence_id(stack.prefix, stack.queue, name, due)
        assert result["headers"]["emq_schedule"] == f"{stack.queue}/{name}"
        assert result["headers"]["celery_beat_task"] is True
        assert result["queue"] == stack.queue
    minutely = labelled(results, "minutely")
    beat = "beat-alias" if key == "multi" else "rabbit-beat"
    assert minutely, f"the crontab entry never ran; {beat}:\n{fleet.log(beat)[-3000:]}"
    assert all(r["headers"]["emq_due_ms"] % 60_000 == 0 for r in minutely)


def test_a_redis_broker_fleet_runs_every_second_and_crontab_entries_with_occurrence_ids(
    fleet: Fleet,
) -> None:
    assert_each_occurrence_ran_once(fleet, "multi")


def test_three_beats_at_once_started_three_ways_run_each_occurrence_once(fleet: Fleet) -> None:
    logs = {name: fleet.log(name) for name in ("beat-path", "beat-alias", "beat-conf")}
    for name, text in logs.items():
        assert "emq-bridge beat: 2 schedule(s) declared" in text, (
            f"{name} did not start:\n{text[-2000:]}"
        )
        assert "registry -> redis://" in text
        assert "(emq-bridge, prefix '" in text  # which keys: a misspelt prefix setting shows
        # The banner names the scheduler that runs (on a worker, -S is --statedb).
        assert "scheduler -> emq_bridge.celery.beat.RepeatScheduler" in text
        assert fleet.stacks["multi"].procs[name].poll() is None, f"{name} exited early"
    assert_each_occurrence_ran_once(fleet, "multi")


def test_a_worker_with_embedded_beat_and_a_second_beat_on_rabbitmq_run_each_occurrence_once(
    fleet: Fleet, rabbitmq_url: str
) -> None:
    assert "rabbit" in fleet.stacks, "RabbitMQ was not reachable when the fleet started"
    for name in ("rabbit-worker-B", "rabbit-beat"):
        assert "emq-bridge beat: 2 schedule(s) declared" in fleet.log(name), fleet.log(name)[-2000:]
        assert fleet.stacks["rabbit"].procs[name].poll() is None, f"{name} exited early"
    assert_each_occurrence_ran_once(fleet, "rabbit")


def test_a_restarted_beat_keeps_the_countdown_and_runs_nothing_extra(fleet: Fleet) -> None:
    stack = fleet.stacks["restart"]
    pulses = labelled(fleet.results("restart"), "pulse")
    restart_at = int(stack.env["EMQT_RESTART_AT"])
    assert len(pulses) >= restart_at + 3, fleet.log("restart-beat-2")[-3000:]
    dues = [p["headers"]["emq_due_ms"] for p in pulses]
    assert len(dues) == len(set(dues)), "no occurrence ran twice across the restart"
    assert all((due - dues[0]) % 3000 == 0 for due in dues), "the 3 s grid survived the restart"
    # Nothing changed: the restart finds its sync's stamp, and converts and syncs nothing.
    assert "unchanged since its last sync (1 schedule(s))" in fleet.log("restart-beat-2")


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ("bad-task", "unknown task 'emqt.nope'"),
        ("bad-schedule", "is not a schedule"),
        ("bad-key", "Celery rejects this entry"),
    ],
)
def test_bad_input_stops_beat_at_start_with_a_clear_error_and_nothing_written(
    fleet: Fleet, variant: str, message: str
) -> None:
    proc = fleet.stacks[variant].procs[variant]
    assert proc.wait(timeout=60) != 0
    text = fleet.log(variant)
    assert message in text
    assert "refuses to start" in text
    assert "Traceback" not in text  # one clear line, not Celery's traceback of it
    client = redis.Redis.from_url(fleet.redis_url)
    assert list(client.scan_iter(match=f"{fleet.stacks[variant].prefix}:*")) == []
    client.close()


def test_a_worker_syncs_decorated_schedules_at_boot(fleet: Fleet) -> None:
    stack = fleet.stacks["boot-ok"]
    repeat = Repeat(redis.Redis.from_url(fleet.redis_url), stack.prefix)
    assert wait_until(lambda: repeat.get(stack.queue, "emqt.hourly") is not None, timeout_s=30)
    assert repeat.get(stack.queue, "emqt.hourly").source == "celery.emqt.recurring"  # type: ignore[union-attr]


def test_a_failed_boot_sync_is_logged_as_an_error_and_the_worker_keeps_serving(
    fleet: Fleet,
) -> None:
    assert wait_until(lambda: "ready" in fleet.log("boot-fail"), timeout_s=30)
    text = fleet.log("boot-fail")
    assert "boot-time sync of the schedules FAILED" in text
    assert fleet.stacks["boot-fail"].procs["boot-fail"].poll() is None
