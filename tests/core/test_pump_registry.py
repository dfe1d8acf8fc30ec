"""`emq-bridge pump --celery/--dramatiq` pumps the app's own registry, and `demo` its server.

The app's registry is where its beat or its workers' pumps fire the schedules: a standalone
pump anywhere else syncs a second copy and fires every slot twice, with other ids. Each test
writes a small app module into its own directory, named after the test's prefix, and runs
the command through click's CliRunner, or as real processes where a beat runs beside it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from quiet import quiet_offset

from emq_bridge import Repeat, occurrence_id
from emq_bridge.cli import cli, operations

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-pw"

CELERY_APP = """
from celery import Celery

app = Celery("regapp", broker={registry!r})
app.conf.update(
    emq_bridge_redis_url={registry!r},
    emq_bridge_prefix={prefix!r},
    task_default_queue={queue!r},
    result_expires=None,  # no celery.backend_cleanup entry
    beat_schedule={{"tick": {{"task": {module!r} + ".tick", "schedule": 1.0}}}},
)


@app.task
def tick():
    pass
"""

DRAMATIQ_APP = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring

broker = RedisBroker(url={broker!r}, namespace={prefix!r})
broker.add_middleware(
    RecurringMiddleware({registry!r}, prefix={prefix!r}, source="regapp", lease_ms=12_345,
                        max_sleep_s=0.25)
)


@recurring(every="1h", offset={offset!r})
@dramatiq.actor(broker=broker, queue_name={queue!r})
def tick():
    pass
"""


@dataclass
class App:
    """One generated app module: its registry (server URL, prefix) and its queue."""

    module: str
    spec: str
    registry: str
    prefix: str
    queue: str
    token: str

    def repeat(self, client: redis.Redis) -> Repeat:
        return Repeat(client, self.prefix)


def server_url(client: redis.Redis, db: int, password: str | None = None) -> str:
    options = client.connection_pool.connection_kwargs
    auth = f":{password}@" if password else ""
    return f"redis://{auth}{options['host']}:{options['port']}/{db}"


def keys_with(client: redis.Redis, token: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"*{token}*", count=1000))


@pytest.fixture
def other_db(client: redis.Redis) -> Iterator[redis.Redis]:
    """Database 1 of the suite's server: another registry on the same server."""
    connection = redis.Redis.from_url(server_url(client, 1))
    yield connection
    connection.close()


@pytest.fixture
def registry_db(client: redis.Redis) -> Iterator[redis.Redis]:
    """Database 2 of the suite's server: where the Dramatiq app's `repeat=` URL points."""
    connection = redis.Redis.from_url(server_url(client, 2))
    yield connection
    connection.close()


def write_app(tmp_path: Path, prefix: str, kind: str, **urls: str) -> App:
    module = f"regapp_{kind}_{prefix}"
    queue = f"{prefix}-q"
    app_prefix = f"{prefix}app"
    text = CELERY_APP if kind == "celery" else DRAMATIQ_APP
    # The Dramatiq app's hourly slot far from now: one passing between two `pump --once`
    # runs would be sent next to the trigger.
    offset = quiet_offset()
    source = text.format(module=module, prefix=app_prefix, queue=queue, offset=offset, **urls)
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    attribute = "app" if kind == "celery" else "broker"
    return App(module, f"{module}:{attribute}", urls["registry"], app_prefix, queue, prefix)


@pytest.fixture
def celery_app(
    tmp_path: Path, client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> App:
    monkeypatch.syspath_prepend(str(tmp_path))
    return write_app(tmp_path, prefix, "celery", registry=server_url(client, 0))


@pytest.fixture
def dramatiq_app(
    tmp_path: Path, client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> App:
    monkeypatch.syspath_prepend(str(tmp_path))
    return write_app(
        tmp_path, prefix, "dramatiq", broker=server_url(client, 0), registry=server_url(client, 2)
    )


Run = Callable[..., Result]


@pytest.fixture
def run() -> Run:
    """Invoke the CLI in-process; `$REDIS_URL` is unset unless the test sets it."""

    def invoke(*args: str, redis_env: str | None = None) -> Result:
        return CliRunner().invoke(cli, list(args), env={"REDIS_URL": redis_env})

    return invoke


def one_line_error(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def celery_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw)["headers"] for raw in client.lrange(queue, 0, -1)]


# -- Celery -------------------------------------------------------------------------------


def test_pump_celery_without_registry_options_syncs_and_pumps_under_the_apps_prefix(
    run: Run, celery_app: App, client: redis.Redis
) -> None:
    first = run("pump", "--celery", celery_app.spec, "--once")
    assert first.exit_code == 0, first.output
    assert "synced celery.regapp: 1 created" in first.stderr
    repeat = celery_app.repeat(client)
    assert repeat.names(celery_app.queue) == ["tick"]
    occurrence = repeat.trigger(celery_app.queue, "tick")
    second = run("pump", "--celery", celery_app.spec, "--once")
    assert second.exit_code == 0, second.output
    # The trigger, and the 1 s schedule's slot too when a second passed since the sync.
    ids = [m["id"] for m in celery_messages(client, celery_app.queue)]
    assert occurrence in ids and len(ids) <= 2
    assert second.stdout.startswith(f"dispatched {len(ids)},")
    assert not list(client.scan_iter(match=f"emq:{{{celery_app.queue}}}*"))


@pytest.mark.parametrize(
    ("options", "redis_env", "named"),
    [
        (["--redis-url", "OTHER"], None, "--redis-url"),
        ([], "OTHER", "$REDIS_URL"),
        (["--prefix", "PREFIX"], None, "--prefix"),
        (["--redis-url", "OTHER", "--prefix", "PREFIX"], None, "--redis-url and --prefix"),
    ],
)
def test_a_registry_option_that_is_not_the_apps_exits_2_in_one_line_and_writes_nothing(
    run: Run,
    celery_app: App,
    client: redis.Redis,
    other_db: redis.Redis,
    options: list[str],
    redis_env: str | None,
    named: str,
) -> None:
    other = server_url(client, 1, password=SECRET)  # never connected to: the check comes first
    given = {"OTHER": other, "PREFIX": f"{celery_app.token}else"}
    options = [given.get(o, o) for o in options]
    result = run(
        *options,
        "pump",
        "--celery",
        celery_app.spec,
        "--once",
        redis_env=other if redis_env else None,
    )
    assert result.exit_code == 2, result.output
    line = one_line_error(result)
    assert f"{named} name" in line and "--force-registry" in line
    assert f"(prefix {celery_app.prefix!r})" in line
    assert SECRET not in result.output
    if named != "--prefix":
        assert ":***@" in line  # the URL given is shown, its password is not
    assert keys_with(client, celery_app.token) == []
    assert keys_with(other_db, celery_app.token) == []


def test_force_registry_pumps_the_registry_given_instead_of_the_apps(
    run: Run, celery_app: App, client: redis.Redis, other_db: redis.Redis
) -> None:
    given = f"{celery_app.token}given"
    result = run(
        "--redis-url",
        server_url(client, 1),
        "--prefix",
        given,
        "pump",
        "--celery",
        celery_app.spec,
        "--force-registry",
        "--once",
    )
    assert result.exit_code == 0, result.output
    assert "--force-registry: pumping" in result.stderr
    assert Repeat(other_db, given).names(celery_app.queue) == ["tick"]
    # Nothing of a registry in the app's database: a slot that came due during the run went
    # to the app's broker there (kombu's queue and binding keys), as it should.
    assert keys_with(client, celery_app.prefix) == []


def test_the_apps_server_and_prefix_given_explicitly_are_no_conflict(
    run: Run, celery_app: App, client: redis.Redis
) -> None:
    result = run(
        "--redis-url",
        server_url(client, 0),
        "--prefix",
        celery_app.prefix,
        "pump",
        "--celery",
        celery_app.spec,
        "--once",
    )
    assert result.exit_code == 0, result.output
    assert celery_app.repeat(client).names(celery_app.queue) == ["tick"]


def test_the_apps_server_under_another_name_is_no_conflict(
    run: Run, celery_app: App, client: redis.Redis
) -> None:
    # Before: `localhost` for the app's `127.0.0.1` exited 2 ("names the registry ... but
    # the app's ... pump ..."): the same server, asked for its run_id, is no conflict.
    options = client.connection_pool.connection_kwargs
    assert options["host"] == "127.0.0.1"
    result = run(
        "--redis-url",
        f"redis://localhost:{options['port']}/0",
        "pump",
        "--celery",
        celery_app.spec,
        "--once",
    )
    assert result.exit_code == 0, result.output
    assert celery_app.repeat(client).names(celery_app.queue) == ["tick"]


# -- Dramatiq -----------------------------------------------------------------------------


def test_pump_dramatiq_uses_the_middlewares_repeat_url_prefix_lease_and_sleep(
    run: Run,
    dramatiq_app: App,
    client: redis.Redis,
    registry_db: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pumps: list[dict[str, Any]] = []
    real_pump = operations.Pump

    def spy(*args: Any, **kwargs: Any) -> Any:
        pumps.append(kwargs)
        return real_pump(*args, **kwargs)

    monkeypatch.setattr(operations, "Pump", spy)
    first = run("pump", "--dramatiq", dramatiq_app.spec, "--once")
    assert first.exit_code == 0, first.output
    assert "synced regapp: 1 created" in first.stderr
    repeat = dramatiq_app.repeat(registry_db)  # repeat= names database 2, not the broker's
    assert repeat.names(dramatiq_app.queue) == ["tick"]
    assert (pumps[-1]["lease_ms"], pumps[-1]["max_sleep_s"]) == (12_345, 0.25)
    occurrence = repeat.trigger(dramatiq_app.queue, "tick")
    second = run("pump", "--dramatiq", dramatiq_app.spec, "--once", "--lease-ms", "777")
    assert second.exit_code == 0, second.output
    assert second.stdout.startswith("dispatched 1,")
    assert (pumps[-1]["lease_ms"], pumps[-1]["max_sleep_s"]) == (777, 0.25)  # given: it wins
    stored = client.hvals(f"{dramatiq_app.prefix}:{dramatiq_app.queue}.msgs")
    assert [json.loads(raw)["message_id"] for raw in stored] == [occurrence]
    assert keys_with(client, f"{dramatiq_app.prefix}:{{") == []  # no registry in the broker's
    assert not list(client.scan_iter(match=f"emq:{{{dramatiq_app.queue}}}*"))


def test_pump_dramatiq_with_redis_url_set_to_the_broker_but_repeat_elsewhere_exits_2(
    run: Run, dramatiq_app: App, client: redis.Redis, registry_db: redis.Redis
) -> None:
    result = run("pump", "--dramatiq", dramatiq_app.spec, "--once", redis_env=server_url(client, 0))
    assert result.exit_code == 2, result.output
    line = one_line_error(result)
    assert "$REDIS_URL names the registry" in line
    assert f"{server_url(client, 2)} (prefix {dramatiq_app.prefix!r})" in line
    assert keys_with(client, dramatiq_app.token) == []
    assert keys_with(registry_db, dramatiq_app.token) == []


def test_pump_dramatiq_with_another_prefix_exits_2_and_forced_uses_it(
    run: Run, dramatiq_app: App, client: redis.Redis, registry_db: redis.Redis
) -> None:
    given = f"{dramatiq_app.token}given"
    refused = run("--prefix", given, "pump", "--dramatiq", dramatiq_app.spec, "--once")
    assert refused.exit_code == 2, refused.output
    assert "--prefix names the registry" in one_line_error(refused)
    assert keys_with(registry_db, dramatiq_app.token) == []
    forced = run(
        "--redis-url",
        server_url(client, 2),
        "--prefix",
        given,
        "pump",
        "--dramatiq",
        dramatiq_app.spec,
        "--force-registry",
        "--once",
    )
    assert forced.exit_code == 0, forced.output
    assert Repeat(registry_db, given).names(dramatiq_app.queue) == ["tick"]
    assert dramatiq_app.repeat(registry_db).names(dramatiq_app.queue) == []


# -- a beat and a standalone pump ---------------------------------------------------------


def start(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(command, env=env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_beat_and_a_standalone_pump_of_the_same_app_send_each_slot_once(
    celery_app: App, client: redis.Redis, tmp_path: Path
) -> None:
    # $REDIS_URL names the app's server, as on a host where the broker is the default Redis:
    # the pump must still use the app's prefix, not the default one.
    env = {
        **os.environ,
        "REDIS_URL": server_url(client, 0),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
    }
    beat_log, pump_log = tmp_path / "beat.log", tmp_path / "pump.log"
    beat_options = ["-S", "emq_bridge.celery:RepeatScheduler", "--max-interval", "1"]
    beat_options += ["--pidfile=", f"--schedule={tmp_path / 'beat.db'}", "-l", "info"]
    beat = start(
        [sys.executable, "-m", "celery", "-A", celery_app.module, "beat", *beat_options],
        env,
        tmp_path,
        beat_log,
    )
    pump = start(
        [
            sys.executable,
            "-m",
            "emq_bridge",
            "pump",
            "--celery",
            celery_app.spec,
            "--max-sleep",
            "0.2",
        ],
        env,
        tmp_path,
        pump_log,
    )
    try:
        wait_for(
            lambda: (
                "emq-bridge beat:" in beat_log.read_text() and "pumping" in pump_log.read_text()
            ),
            60,
            "the beat and the pump to start",
        )
        both_up_ms = int(time.time() * 1000)
        wait_for(
            lambda: (
                sum(
                    int(m["emq_due_ms"]) > both_up_ms
                    for m in celery_messages(client, celery_app.queue)
                )
                >= 3
            ),
            30,
            "three slots sent while both run",
        )
    finally:
        stop(beat)
        stop(pump)
    messages = celery_messages(client, celery_app.queue)
    ids = [m["id"] for m in messages]
    assert len(ids) == len(set(ids)), "an occurrence was sent twice"
    dues = sorted(int(m["emq_due_ms"]) for m in messages)
    assert all(b - a == 1000 for a, b in pairwise(dues)), dues  # one grid: one registry
    for message in messages:
        assert message["id"] == occurrence_id(
            celery_app.prefix, celery_app.queue, "tick", int(message["emq_due_ms"])
        ), (message, pump_log.read_text())
    assert not list(client.scan_iter(match=f"emq:{{{celery_app.queue}}}*"))


# -- demo ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_runs_on_the_redis_url_given_and_leaves_no_key_behind(
    client: redis.Redis, redis_url: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(REPO)
    url = server_url(client, 0)
    done = subprocess.run(
        [sys.executable, "-m", "emq_bridge", "--redis-url", url, "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    options = client.connection_pool.connection_kwargs
    found = re.search(r"server at (\S+); keys under (emq-demo-[0-9a-f]+)", done.stdout)
    assert found, done.stdout
    assert found[1] == f"{options['host']}:{options['port']}/0"  # the server given, not its own
    assert "distinct occurrence ids" in done.stdout
    assert list(client.scan_iter(match=f"{found[2]}*", count=1000)) == []


def test_demo_on_an_unreachable_redis_url_exits_3_in_one_line(run: Run) -> None:
    result = run("--redis-url", f"redis://:{SECRET}@127.0.0.1:1/0", "demo")
    assert result.exit_code == 3, result.output
    line = one_line_error(result)
    assert "cannot reach Redis" in line and SECRET not in result.output
