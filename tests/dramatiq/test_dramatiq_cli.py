"""The Dramatiq integration under the `dramatiq` command: real worker processes.

Each test writes a small app module into its own directory, parametrised through the
environment (Redis URL, registry prefix, broker namespace, queue), and runs
`python -m dramatiq <module>` on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import dramatiq
import pytest
import redis
from quiet import quiet_offset

from emq_bridge import ConfigError, Repeat, occurrence_id
from emq_bridge.dramatiq import DramatiqDispatcher, PipelinedDramatiqDispatcher, load_target

REPO = Path(__file__).resolve().parents[2]

APP = """
import json
from itertools import pairwise
import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from emq_bridge.dramatiq import RecurringMiddleware, every, recurring

broker = RedisBroker(url=os.environ["REDIS_URL"], namespace=os.environ["APP_NAMESPACE"])
broker.add_middleware(CurrentMessage())
PIPELINED = {"auto": None, "off": False}[os.environ.get("APP_PIPELINED", "auto")]
broker.add_middleware(
    RecurringMiddleware(prefix=os.environ["APP_PREFIX"], max_sleep_s=0.5, pipelined=PIPELINED)
)
dramatiq.set_broker(broker)
client = redis.Redis.from_url(os.environ["REDIS_URL"])
QUEUE = os.environ["APP_QUEUE"]


def record(*args):
    message = CurrentMessage.get_current_message()
    client.rpush(os.environ["APP_PREFIX"] + ":seen", json.dumps({
        "pid": os.getpid(), "message_id": message.message_id,
        "name": message.options["emq_name"], "due_ms": message.options["emq_due_ms"],
    }))


@recurring(every="1s")
@dramatiq.actor(queue_name=QUEUE)
def fast():
    record()


@recurring(every="2s", name="slow-a", args=["a"])
@recurring(every="2s", name="slow-b", args=["b"])
@dramatiq.actor(queue_name=QUEUE)
def slow(tag):
    record(tag)


# Its slot far from now (APP_OFFSET): a pump run at the top of the hour would send it.
@dramatiq.actor(
    queue_name=QUEUE, recurring=every("1h", name="hourly", offset=os.environ.get("APP_OFFSET"))
)
def hourly():
    record()
"""


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class AppDir:
    """A directory holding one generated app module, and the environment to run it."""

    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        token = uuid.uuid4().hex[:10]
        self.root = root
        self.module = f"emq_test_app_{token}"
        self.prefix = prefix
        self.queue = f"q{token}"
        (root / f"{self.module}.py").write_text(APP)
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "APP_PREFIX": prefix,
            "APP_NAMESPACE": f"dq{token}",
            "APP_QUEUE": self.queue,
            "APP_OFFSET": quiet_offset(),
            "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
        }

    def run(self, command: list[str], cwd: Path) -> Worker:
        log = self.root / f"{uuid.uuid4().hex[:8]}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                command, env=self.env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT
            )
        return Worker(process, log)

    def dramatiq(self, *args: str) -> Worker:
        """Run `python -m dramatiq <the app module> <args>`."""
        return self.run(
            [sys.executable, "-m", "dramatiq", self.module, "--path", str(self.root), *args],
            self.root,
        )


class Worker:
    """A `dramatiq` command running in the background, its output going to a file."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def stop(self) -> str:
        """SIGTERM it (a graceful shutdown), wait, and return its output."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.log.read_text(errors="replace")


@pytest.fixture
def app(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[AppDir]:
    sys.path.insert(0, str(tmp_path))
    yield AppDir(tmp_path, redis_url, prefix)
    sys.path.remove(str(tmp_path))


def test_three_workers_booting_at_once_make_one_registration_per_name_and_fire_each_slot_once(
    app: AppDir,
    client: redis.Redis,
) -> None:
    worker = app.dramatiq("--processes", "3", "--threads", "1")
    seen_key = f"{app.prefix}:seen"
    try:
        wait_for(lambda: client.llen(seen_key) >= 12, 45, "twelve executions")
    finally:
        output = worker.stop()
    assert output.count("emq-bridge pump started") == 3, output
    assert output.count("(pipelined)") == 3, output  # the automatic choice on a RedisBroker
    repeat = Repeat(client, app.prefix)
    registrations = repeat.list(app.queue)
    assert sorted(r.name for r in registrations) == ["fast", "hourly", "slow-a", "slow-b"]
    assert {r.source for r in registrations} == {"dramatiq"}
    seen = [json.loads(raw) for raw in client.lrange(seen_key, 0, -1)]
    ids = [s["message_id"] for s in seen]
    assert len(ids) == len(set(ids)), "an occurrence executed twice"
    for name, every_ms in (("fast", 1000), ("slow-a", 2000), ("slow-b", 2000)):
        dues = sorted(s["due_ms"] for s in seen if s["name"] == name)
        assert dues and all(b - a == every_ms for a, b in pairwise(dues)), (name, dues)
    for execution in seen:
        assert execution["message_id"] == occurrence_id(
            app.prefix, app.queue, execution["name"], execution["due_ms"]
        )


def test_a_worker_whose_registry_is_unreachable_exits_with_a_clear_error(app: AppDir) -> None:
    app.env["REDIS_URL"] = "redis://127.0.0.1:1/0"
    worker = app.dramatiq("--processes", "1", "--threads", "1")
    try:
        worker.process.wait(timeout=60)
    finally:
        output = worker.stop()
    assert worker.process.returncode != 0
    assert "BootError" in output and "Redis is unreachable" in output, output


def test_load_target_imports_the_app_and_returns_its_dispatcher_queues_and_declarations(
    app: AppDir,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dramatiq.broker, "global_broker", dramatiq.broker.global_broker)
    for key in ("REDIS_URL", "APP_PREFIX", "APP_NAMESPACE", "APP_QUEUE"):
        monkeypatch.setenv(key, app.env[key])
    target = load_target(f"{app.module}:broker")
    # The workers' dispatcher: automatic, so pipelined on the app's RedisBroker.
    assert type(target.dispatcher) is PipelinedDramatiqDispatcher
    assert target.queues == (app.queue,)
    assert target.source == "dramatiq"
    assert sorted(d.name for d in target.declarations) == ["fast", "hourly", "slow-a", "slow-b"]
    # The module form finds the broker the module set, as `dramatiq` does.
    assert load_target(app.module).dispatcher.broker is target.dispatcher.broker  # type: ignore[attr-defined]


def test_load_target_rejects_a_module_that_cannot_be_imported_or_an_attribute_that_is_not_a_broker(
    app: AppDir,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="cannot import Dramatiq app"):
        load_target("emq_no_such_module_here:broker")
    (app.root / f"{app.module}_broken.py").write_text("raise RuntimeError('no config here')\n")
    with pytest.raises(ConfigError, match=r"RuntimeError: no config here \(-vv shows"):
        load_target(f"{app.module}_broken")
    (app.root / f"{app.module}_plain.py").write_text("value = 3\n")
    with pytest.raises(ConfigError, match="neither a Dramatiq broker"):
        load_target(f"{app.module}_plain:value")
    with pytest.raises(ConfigError, match="has no attribute"):
        load_target(f"{app.module}_plain:missing")
    monkeypatch.setattr(dramatiq.broker, "global_broker", None)
    with pytest.raises(ConfigError, match="set no Dramatiq broker"):
        load_target(f"{app.module}_plain")


def test_the_example_app_runs_under_the_dramatiq_command(app: AppDir, client: redis.Redis) -> None:
    app.env.update(EMQ_PREFIX=app.prefix, DRAMATIQ_NAMESPACE=f"dq{app.prefix}")
    worker = app.run(
        [
            sys.executable,
            "-m",
            "dramatiq",
            "examples.dramatiq_app",
            "--processes",
            "1",
            "--threads",
            "2",
        ],
        REPO,
    )
    repeat = Repeat(client, app.prefix)

    def heartbeats() -> int:
        registration = repeat.get("heartbeats", "heartbeat")
        return registration.fired if registration is not None else 0

    try:
        wait_for(lambda: heartbeats() >= 2, 30, "two heartbeats")
    finally:
        output = worker.stop()
    assert "heartbeat: heartbeat due" in output, output
    assert sorted(repeat.names("reports")) == ["morning-digest", "refresh_reports", "weekly-digest"]
    assert repeat.names("maintenance") == ["purge_tmp"]


def test_the_standalone_pump_command_syncs_the_app_and_enqueues_real_dramatiq_messages(
    app: AppDir,
    client: redis.Redis,
) -> None:
    command = [sys.executable, "-m", "emq_bridge", "--prefix", app.prefix, "pump"]
    command += ["--dramatiq", f"{app.module}:broker", "--once"]
    first = subprocess.run(command, env=app.env, cwd=app.root, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    repeat = Repeat(client, app.prefix)
    assert sorted(repeat.names(app.queue)) == ["fast", "hourly", "slow-a", "slow-b"]
    # Their first slots are on the 1 s / 2 s grid, maybe a few ms after the sync (the first
    # run may have sent one): paused, and the queue emptied, only the trigger below is sent
    # by the second run, however long it takes to start.
    for name in ("fast", "slow-a", "slow-b"):
        repeat.pause(app.queue, name)
    broker_queue = f"{app.env['APP_NAMESPACE']}:{app.queue}"
    client.delete(f"{broker_queue}.msgs", broker_queue)
    occurrence = repeat.trigger(app.queue, "slow-a")
    second = subprocess.run(command, env=app.env, cwd=app.root, capture_output=True, text=True)
    assert second.returncode == 0 and "dispatched 1" in second.stdout, second.stderr
    stored = client.hvals(f"{app.env['APP_NAMESPACE']}:{app.queue}.msgs")
    messages = [dramatiq.Message.decode(raw) for raw in stored]
    assert [(m.message_id, m.actor_name, m.args) for m in messages] == [
        (occurrence, "slow", ("a",))
    ]
    assert messages[0].options["emq_name"] == "slow-a"


def test_the_demo_shows_executions_as_they_happen_then_a_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from emq_bridge.dramatiq import demo

    demo.main(seconds=2.5)
    out = capsys.readouterr().out
    assert "+ demo/heartbeat  every 1s" in out
    assert "heartbeat()            heartbeat      slot" in out
    assert "Summary after" in out and "distinct occurrence ids" in out


@pytest.mark.parametrize(
    ("setting", "flag", "expected"),
    [
        ("auto", False, PipelinedDramatiqDispatcher),
        ("off", False, DramatiqDispatcher),
        ("off", True, PipelinedDramatiqDispatcher),
    ],
    ids=["auto", "opted-out", "opted-out-but---pipelined"],
)
def test_the_standalone_pump_sends_as_the_workers_do_unless_told_pipelined(
    app: AppDir,
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    flag: bool,
    expected: type[DramatiqDispatcher],
) -> None:
    monkeypatch.setattr(dramatiq.broker, "global_broker", dramatiq.broker.global_broker)
    for key in ("REDIS_URL", "APP_PREFIX", "APP_NAMESPACE", "APP_QUEUE"):
        monkeypatch.setenv(key, app.env[key])
    monkeypatch.setenv("APP_PIPELINED", setting)
    module = f"{app.module}_{setting}_{flag}"  # imported afresh: its middleware reads the env
    (app.root / f"{module}.py").write_text(APP)
    target = load_target(f"{module}:broker", pipelined=flag)
    assert type(target.dispatcher) is expected
