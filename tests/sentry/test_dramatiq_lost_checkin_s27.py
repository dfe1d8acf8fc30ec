"""Sentry Crons on Dramatiq when a worker is killed mid-run: the run's check-in is closed.

A SIGKILLed worker sends no `ok`/`error`, so Sentry kept the run `in_progress` until its
max runtime (a timeout, 30 minutes later by default). Now the pump that marks the occurrence
lost, in another worker, sends its `error` check-in, with the same slug and check-in id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from quiet import quiet_offset
from test_sentry_crons import check_ins

from emq_bridge import Repeat
from emq_bridge.errors import ConfigError

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 45
HEARTBEAT_S = 0.3  # a killed worker's occurrence is lost 3 heartbeats after its last one

APP = """
import os, time

import crons_capture
import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring
from emq_bridge.dramatiq.schedule import broker_declarations
from emq_bridge.dramatiq.sentry import SentryCrons

crons_capture.init([])
QUEUE = os.environ["LOST_QUEUE"]
broker = RedisBroker(url=os.environ["LOST_BROKER"], namespace=QUEUE + "-dq")
middleware = RecurringMiddleware(
    prefix=os.environ["LOST_PREFIX"], max_sleep_s=0.2, heartbeat_s=float(os.environ["LOST_HB"])
)
broker.add_middleware(middleware)
broker.add_middleware(SentryCrons())
dramatiq.set_broker(broker)


@recurring(every="2h", offset=os.environ["LOST_OFFSET"], name="nightly-export")
@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def export():
    with open(os.environ["LOST_PID_FILE"], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(60)  # killed long before


def seed():
    repeat = middleware.registry(broker)
    items = [(d.queue, d.name, d.definition) for d in broker_declarations(broker)]
    past_ms = repeat.server_time_ms() - 3 * 86_400_000  # due when the worker starts
    repeat.upsert_many(items, source=middleware.source, now_ms=past_ms)
"""


def _wait(condition: Callable[[], Any], what: str, logs: list[Path]) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while not (found := condition()):
        tails = "\n".join(log.read_text(errors="replace")[-2000:] for log in logs if log.exists())
        assert time.monotonic() < deadline, f"no {what}:\n{tails}"
        time.sleep(0.1)
    return found


def _start(tmp_path: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "lost_app", "-p", "1", "-t", "1"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed with its children
        )  # fmt: skip


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def test_a_sigkilled_run_gets_an_error_check_in_from_the_pump_that_marks_it_lost(
    tmp_path: Path, redis_url: str, prefix: str, repeat: Repeat
) -> None:
    queue = f"{prefix}-q"
    envelopes, pid_file = tmp_path / "checkins.jsonl", tmp_path / "actor.pid"
    (tmp_path / "lost_app.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE)]),
        "LOST_BROKER": redis_url,
        "LOST_QUEUE": queue,
        "LOST_PREFIX": prefix,
        "LOST_HB": str(HEARTBEAT_S),
        "LOST_OFFSET": quiet_offset("2h"),
        "LOST_PID_FILE": str(pid_file),
        "SENTRY_ENVELOPES": str(envelopes),
    }
    seeded = subprocess.run(
        [sys.executable, "-c", "import lost_app; lost_app.seed()"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    logs = [tmp_path / "victim.log", tmp_path / "survivor.log"]
    victim = _start(tmp_path, env, logs[0])
    survivor = None
    try:

        def running() -> bool:
            entries = repeat.history(queue, "nightly-export")
            return bool(entries) and entries[0].status == "running"

        _wait(running, "start reported to the registry", logs)
        _wait(pid_file.exists, "actor pid", logs)
        assert [c["status"] for c in check_ins(envelopes)] == ["in_progress"]
        os.killpg(victim.pid, signal.SIGKILL)  # the actor's process and its parent
        victim.wait()
        survivor = _start(tmp_path, env, logs[1])  # its pump notices the silence

        def closed() -> list[dict[str, Any]]:
            return [c for c in check_ins(envelopes) if c["status"] != "in_progress"]

        _wait(closed, "check-in closing the killed run", logs)
        [entry] = repeat.history(queue, "nightly-export")
        assert entry.status == "lost"
    finally:
        _stop(victim)
        if survivor is not None:
            _stop(survivor)
    started, ended = check_ins(envelopes)
    assert (started["status"], ended["status"]) == ("in_progress", "error")
    assert started["monitor_slug"] == ended["monitor_slug"] == "nightly-export"
    assert started["check_in_id"] == ended["check_in_id"] == uuid.UUID(entry.id).hex
    assert ended["monitor_config"] == started["monitor_config"]
    assert ended["monitor_config"]["schedule"] == {"type": "interval", "value": 2, "unit": "hour"}


def test_only_the_check_ins_sentry_crons_opened_are_closed_as_lost(repeat: Repeat) -> None:
    # A trigger and a schedule Sentry Crons cannot take got no `in_progress`: no `error`.
    import dramatiq
    import sentry_sdk
    from dramatiq.brokers.stub import StubBroker
    from sentry_sdk.transport import Transport

    from emq_bridge.dramatiq import RecurringMiddleware, recurring
    from emq_bridge.dramatiq.sentry import SentryCrons
    from emq_bridge.events import PumpEvents
    from emq_bridge.occurrence import occurrence_id

    sent: list[dict[str, Any]] = []

    class Kept(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            sent.extend(item.payload.json for item in envelope.items)

    broker = StubBroker()
    recurring_middleware = RecurringMiddleware(repeat, run_pump=False)
    broker.add_middleware(recurring_middleware)
    broker.add_middleware(SentryCrons(max_runtime=90))

    @recurring(cron="0 3 * * *", name="nightly")
    @dramatiq.actor(broker=broker, queue_name="lq")
    def nightly() -> None: ...

    @recurring(every="30s", name="often")  # under a minute: not monitored
    @dramatiq.actor(broker=broker, queue_name="lq")
    def often() -> None: ...

    sentry_sdk.init(dsn="http://key@127.0.0.1:9/1", transport=Kept, default_integrations=False)
    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()  # installs the listener the pump thread would get
    try:
        listeners: list[PumpEvents] = list(recurring_middleware.listeners)
        assert len(listeners) == 1
        due_ms = 1_900_000_000_000
        slot = occurrence_id(repeat.prefix, "lq", "nightly", due_ms)
        listeners[0].on_lost("lq", "nightly", due_ms, slot)
        triggered = occurrence_id(repeat.prefix, "lq", "nightly", due_ms, triggered=True)
        listeners[0].on_lost("lq", "nightly", due_ms, triggered)
        listeners[0].on_lost(
            "lq", "often", due_ms, occurrence_id(repeat.prefix, "lq", "often", due_ms)
        )
    finally:
        worker.stop()
        sentry_sdk.get_client().close()
        sentry_sdk.init()  # no DSN: nothing sent by later tests of this process
    [check_in] = sent
    assert (check_in["monitor_slug"], check_in["status"]) == ("nightly", "error")
    assert check_in["check_in_id"] == uuid.UUID(slot).hex
    assert check_in["monitor_config"] == {
        "schedule": {"type": "crontab", "value": "0 3 * * *"},
        "timezone": "UTC",
        "max_runtime": 90,
    }


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "30"])
def test_a_max_runtime_that_is_not_whole_minutes_is_refused(bad: Any) -> None:
    from emq_bridge.dramatiq.sentry import SentryCrons

    with pytest.raises(ConfigError, match=r"SentryCrons\(max_runtime=...\) must be a positive"):
        SentryCrons(max_runtime=bad)
