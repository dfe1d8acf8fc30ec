"""`emq-bridge pump --dramatiq APP` syncs as the app's workers do at boot.

The deploy step of docs/dramatiq.md (workers with `sync_at_boot=False`, one
`emq-bridge pump --dramatiq app --once`) must write what a worker's boot would: the
middleware's generation (an older app's command reverts nothing), its `prune=False` (a
schedule whose decorator is gone stays), and its `schedule_file` (synced under the file's
source). Each run is the real command in a new process, on a generated app module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import redis
from quiet import quiet_offset

from emq_bridge import Repeat

REPO = Path(__file__).resolve().parents[2]

APP = """
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring

broker = RedisBroker(url=os.environ["REDIS_URL"], namespace=os.environ["APP_NAMESPACE"])
GENERATION = os.environ.get("APP_GENERATION")
broker.add_middleware(
    RecurringMiddleware(
        prefix=os.environ["APP_PREFIX"],
        source="team",
        generation=int(GENERATION) if GENERATION else None,
        prune=os.environ.get("APP_PRUNE", "1") == "1",
        schedule_file=os.environ.get("APP_FILE") or None,
        sync_at_boot=False,
    )
)
dramatiq.set_broker(broker)
QUEUE = os.environ["APP_QUEUE"]
OFFSET = os.environ["APP_OFFSET"]


@recurring(every=os.environ.get("APP_EVERY", "1h"), offset=OFFSET)
@dramatiq.actor(queue_name=QUEUE)
def kept():
    pass


@dramatiq.actor(queue_name=QUEUE)
def added():
    pass


if os.environ.get("APP_ADDED") == "1":
    recurring(every="1h", offset=OFFSET)(added)
"""


class App:
    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        token = uuid.uuid4().hex[:10]
        self.root = root
        self.module = f"emq_pump_sync_app_{token}"
        self.queue = f"q{token}"
        self.prefix = prefix
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

    def pump_once(
        self, *files: Path, status: int = 0, **env: str
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "emq_bridge", "--prefix", self.prefix, "pump"]
        command += ["--dramatiq", f"{self.module}:broker", "--once"]
        for file in files:
            command += ["-f", str(file)]
        done = subprocess.run(
            command,
            env={**self.env, **env},
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == status, done.stderr
        return done

    def file(self, path: Path, task: str, **fields: str) -> Path:
        """A schedule file of one entry, `from-file`, for `task`, with `fields` (TOML)."""
        extra = "".join(f"{key} = {value}\n" for key, value in fields.items())
        path.write_text(
            f'source = "ops"\nqueue = "{self.queue}"\n\n[[schedule]]\nname = "from-file"\n'
            f'task = "{task}"\nevery = "2h"\noffset = "{self.env["APP_OFFSET"]}"\n{extra}'
        )
        return path


def cadences(repeat: Repeat, queue: str) -> dict[str, int | None]:
    return {
        name: repeat.get(queue, name).definition.cadence.every_ms for name in repeat.names(queue)
    }  # type: ignore[attr-defined]


def test_an_older_generation_of_the_app_reverts_nothing_through_the_command(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    app = App(tmp_path, redis_url, prefix)
    repeat = Repeat(client, prefix)
    # 2h: the quiet offset of an hourly grid (under 1 h) is a valid offset of it too.
    app.pump_once(APP_GENERATION="3", APP_EVERY="2h", APP_ADDED="1")
    assert cadences(repeat, app.queue) == {"added": 3_600_000, "kept": 7_200_000}
    old = app.pump_once(APP_GENERATION="1", APP_EVERY="1h")  # the previous release's code
    assert "not synced team: generation 1 is older than the live 3" in old.stderr, old.stderr
    assert cadences(repeat, app.queue) == {"added": 3_600_000, "kept": 7_200_000}


def test_prune_false_keeps_a_schedule_whose_decorator_is_gone(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    app = App(tmp_path, redis_url, prefix)
    repeat = Repeat(client, prefix)
    app.pump_once(APP_ADDED="1", APP_PRUNE="0")
    assert sorted(repeat.names(app.queue)) == ["added", "kept"]
    app.pump_once(APP_PRUNE="0")
    assert sorted(repeat.names(app.queue)) == ["added", "kept"]
    app.pump_once(APP_PRUNE="1")  # the default prunes it, as a worker's boot does
    assert repeat.names(app.queue) == ["kept"]


def test_the_middlewares_schedule_file_is_synced_under_its_own_source(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    app = App(tmp_path, redis_url, prefix)
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(
        f'source = "ops"\nqueue = "{app.queue}"\n\n[[schedule]]\nname = "from-file"\n'
        f'task = "added"\nevery = "2h"\noffset = "{app.env["APP_OFFSET"]}"\n'
    )
    done = app.pump_once(APP_FILE=str(schedules))
    assert "synced ops: 1 created" in done.stderr, done.stderr
    repeat = Repeat(client, prefix)
    assert sorted(repeat.names(app.queue)) == ["from-file", "kept"]
    assert repeat.get(app.queue, "from-file").source == "ops"
    assert repeat.get(app.queue, "kept").source == "team"
    # Run again on the same file: its stamp holds, and the count says what it vouches for.
    again = app.pump_once(APP_FILE=str(schedules))
    assert "synced ops: 0 created, 0 updated, 0 removed, 1 unchanged (its stamp holds" in (
        again.stderr
    ), again.stderr


def test_a_file_the_workers_would_refuse_fails_the_command_before_anything_is_written(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # The app's own file refuses overlap=replace (Dramatiq cannot revoke): the command given
    # another, valid, file with -f writes neither, and says why in one line.
    app = App(tmp_path, redis_url, prefix)
    refused = app.file(tmp_path / "app.toml", "added", overlap='"replace"')
    valid = app.file(tmp_path / "more.toml", "kept")
    valid.write_text(valid.read_text().replace('"ops"', '"more"').replace("from-file", "more"))
    done = app.pump_once(valid, status=1, APP_FILE=str(refused))
    assert "overlap='replace' is not available on Dramatiq" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert Repeat(client, prefix).names(app.queue) == []


def test_a_file_given_with_f_is_checked_against_the_brokers_actors(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    # As the workers check their own schedule file: an actor the broker does not declare,
    # or overlap=replace, is refused (exit 1, one line) and nothing is written.
    app = App(tmp_path, redis_url, prefix)
    unknown = app.file(tmp_path / "unknown.toml", "no_such_actor")
    done = app.pump_once(unknown, status=1)
    assert "names actor 'no_such_actor', which is not declared" in done.stderr, done.stderr
    replace = app.file(tmp_path / "replace.toml", "added", overlap='"replace"')
    done = app.pump_once(replace, status=1)
    assert "overlap='replace' is not available on Dramatiq" in done.stderr, done.stderr
    assert Repeat(client, prefix).names(app.queue) == []
    done = app.pump_once(app.file(tmp_path / "fine.toml", "added"))
    assert sorted(Repeat(client, prefix).names(app.queue)) == ["from-file", "kept"]
