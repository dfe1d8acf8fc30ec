"""An actor no worker declares: the schedule is parked after one try, not retried forever.

`emq-bridge add q ghost --task no_such_actor --every 1s` is accepted (the name cannot be
checked without the app, and it says so); a `dramatiq` worker whose middleware pumps `q`
then tries it once, parks it with the reason, logs one line and keeps no lease, while its
neighbour keeps firing. `add --dramatiq SPEC` refuses the name up front.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis
from click.testing import CliRunner
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Occurrence, Repeat, occurrence_id
from emq_bridge.cli import cli
from emq_bridge.dramatiq import DramatiqDispatcher
from emq_bridge.errors import PermanentDispatchError

GHOST = "no_such_actor"

APP = textwrap.dedent("""
    import os

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, current_occurrence

    env = os.environ
    broker = RedisBroker(url=env["PF_REDIS"], namespace=env["PF_NAMESPACE"])
    broker.add_middleware(RecurringMiddleware(prefix=env["PF_PREFIX"], max_sleep_s=0.5))
    dramatiq.set_broker(broker)
    results = redis.Redis.from_url(env["PF_REDIS"])


    @dramatiq.actor(queue_name=env["PF_QUEUE"], actor_name="healthy")
    def healthy():
        results.rpush(env["PF_PREFIX"] + ":ran", current_occurrence().name)
""")


class App:
    """A generated app module, its names, and the environment of its processes."""

    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        token = uuid.uuid4().hex[:8]
        self.root, self.prefix = root, prefix
        self.module, self.queue, self.namespace = f"pf_app_{token}", f"q{token}", f"pn{token}"
        (root / f"{self.module}.py").write_text(APP)
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
            "PF_REDIS": redis_url,
            "PF_PREFIX": prefix,
            "PF_QUEUE": self.queue,
            "PF_NAMESPACE": self.namespace,
        }

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "emq_bridge", "--redis-url", self.env["PF_REDIS"]]
        return subprocess.run(
            [*command, "--prefix", self.prefix, *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def app(tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis) -> Iterator[App]:
    built = App(tmp_path, redis_url, prefix)
    yield built
    keys = list(client.scan_iter(match=f"{built.namespace}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_parks_a_schedule_of_an_undeclared_actor_after_one_try_and_logs_it_once(
    app: App, client: redis.Redis
) -> None:
    added = app.cli("add", app.queue, "ghost", "--task", GHOST, "--every", "1s")
    assert added.returncode == 0, added.stderr
    assert f"task {GHOST!r} was not checked" in added.stderr
    assert app.cli("add", app.queue, "beat", "--task", "healthy", "--every", "1s").returncode == 0
    repeat = Repeat(client, app.prefix)
    log = app.root / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "dramatiq", app.module, "--path", str(app.root)),
                *("--processes", "1", "--threads", "1"),
            ],
            cwd=app.root,
            env=app.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while (ghost := repeat.get(app.queue, "ghost")) is None or ghost.parked_reason is None:
            assert worker.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the ghost schedule was never parked"
            time.sleep(0.1)
        ran_before = client.llen(f"{app.prefix}:ran")
        time.sleep(3)  # three more slots of each: the ghost is not tried again
        assert client.llen(f"{app.prefix}:ran") > ran_before, "the neighbour stopped firing"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    output = log.read_text(errors="replace")
    lines = [line for line in output.splitlines() if "/ghost" in line]
    # The worker boots in seconds, past the first slots of the 1 s grid: at most one line
    # counts them (the misfire policy's), before the one that parks the schedule.
    missed = [line for line in lines if "missed, unclaimed in time" in line]
    assert len(missed) <= 1, "\n".join(missed)
    lines = [line for line in lines if line not in missed]
    assert len(lines) == 1, "\n".join(lines[:10])
    assert "parked" in lines[0] and "is not declared" in lines[0]
    assert "Traceback" not in output
    ghost = repeat.get(app.queue, "ghost")
    assert ghost is not None and ghost.paused and ghost.fired == 0
    assert ghost.parked_reason is not None and ghost.parked_reason.startswith(
        f"actor {GHOST!r} is not declared"
    )
    assert [name for name, _, _ in repeat.leases(app.queue)] == []

    shown = app.cli("show", app.queue, "ghost")
    assert "state     parked since" in shown.stdout and "is not declared" in shown.stdout
    assert "fired     0" in shown.stdout
    listed = app.cli("list", app.queue)
    assert f"parked: actor {GHOST!r} is not declared" in listed.stdout


def test_add_with_the_dramatiq_app_refuses_an_undeclared_actor_and_writes_nothing(
    app: App, redis_url: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dramatiq.broker, "global_broker", dramatiq.broker.global_broker)
    monkeypatch.syspath_prepend(str(app.root))
    monkeypatch.chdir(app.root)
    for key in ("PF_REDIS", "PF_PREFIX", "PF_QUEUE", "PF_NAMESPACE"):
        monkeypatch.setenv(key, app.env[key])
    runner = CliRunner()
    base = ["--redis-url", redis_url, "--prefix", app.prefix, "add", app.queue]
    spec = f"{app.module}:broker"

    refused = runner.invoke(
        cli, [*base, "ghost", "--task", GHOST, "--every", "1s", "--dramatiq", spec]
    )
    assert refused.exit_code == 1, refused.output
    [line] = refused.stderr.strip().splitlines()
    assert f"actor {GHOST!r} is not declared" in line and "nothing written" in line
    assert Repeat(client, app.prefix).get(app.queue, "ghost") is None

    added = runner.invoke(
        cli, [*base, "beat", "--task", "healthy", "--every", "1s", "--dramatiq", spec]
    )
    assert added.exit_code == 0, added.output
    assert added.stderr == ""  # checked: no note
    assert Repeat(client, app.prefix).get(app.queue, "beat") is not None


def occurrence(template: dict[str, object]) -> Occurrence:
    return Occurrence(
        queue="q",
        name="n",
        due_ms=0,
        id=occurrence_id("emq", "q", "n", 0),
        template=template,
        released_ms=0,
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [({"task": GHOST}, "is not declared on this broker"), ({"args": []}, "task")],
    ids=["undeclared actor", "no task"],
)
def test_an_undeclared_actor_or_an_unreadable_template_is_a_permanent_failure(
    template: dict[str, object], message: str
) -> None:
    dispatcher = DramatiqDispatcher(StubBroker())
    with pytest.raises(PermanentDispatchError, match=message):
        dispatcher.dispatch(occurrence(template))
