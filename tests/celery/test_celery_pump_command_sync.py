"""`emq-bridge pump --celery APP` syncs as the app's beat does at boot.

The command stands in for `celery beat` (README): it must write what the beat would, the
`emq_bridge_generation` (an older app's command reverts nothing a newer beat synced) and
the `emq_bridge_schedule_file` (synced under the file's own source, not only pumped). Each
run is the real command in a new process, on a generated app module.
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
from datetime import timedelta

from celery import Celery

app = Celery("pumpsync", broker=os.environ["REDIS_URL"])
GENERATION = os.environ.get("APP_GENERATION")
app.conf.update(
    task_default_queue=os.environ["APP_QUEUE"],
    emq_bridge_prefix=os.environ["APP_PREFIX"],
    emq_bridge_source="team",
    emq_bridge_generation=int(GENERATION) if GENERATION else None,
    emq_bridge_schedule_file=os.environ.get("APP_FILE") or None,
    beat_schedule={
        "kept": {
            "task": "pumpsync.job",
            "schedule": timedelta(minutes=int(os.environ.get("APP_MINUTES", "60"))),
            "offset": os.environ["APP_OFFSET"],
        },
    },
)


@app.task(name="pumpsync.job")
def job():
    pass
"""


class App:
    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        token = uuid.uuid4().hex[:10]
        self.root = root
        self.module = f"emq_celery_pump_sync_{token}"
        self.queue = f"q{token}"
        self.prefix = prefix
        (root / f"{self.module}.py").write_text(APP)
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "APP_PREFIX": prefix,
            "APP_QUEUE": self.queue,
            "APP_OFFSET": quiet_offset(),
            "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
        }

    def pump_once(self, **env: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "emq_bridge", "--prefix", self.prefix, "pump"]
        command += ["--celery", f"{self.module}:app", "--once"]
        done = subprocess.run(
            command,
            env={**self.env, **env},
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done


def every_ms(repeat: Repeat, queue: str, name: str) -> int:
    registration = repeat.get(queue, name)
    assert registration is not None
    return registration.definition.cadence.every_ms  # type: ignore[attr-defined, no-any-return]


def test_an_older_generation_of_the_app_reverts_nothing_through_the_command(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    app = App(tmp_path, redis_url, prefix)
    repeat = Repeat(client, prefix)
    # 2 h: the quiet offset of an hourly grid (under 1 h) is a valid offset of it too.
    app.pump_once(APP_GENERATION="3", APP_MINUTES="120")
    assert every_ms(repeat, app.queue, "kept") == 7_200_000
    old = app.pump_once(APP_GENERATION="1", APP_MINUTES="60")  # the previous release's code
    assert "not synced team: generation 1 is older than the live 3" in old.stderr, old.stderr
    assert every_ms(repeat, app.queue, "kept") == 7_200_000


def test_the_apps_schedule_file_is_synced_under_its_own_source(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    app = App(tmp_path, redis_url, prefix)
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(
        f'source = "ops"\nqueue = "{app.queue}"\n\n[[schedule]]\nname = "from-file"\n'
        f'task = "pumpsync.job"\nevery = "2h"\noffset = "{app.env["APP_OFFSET"]}"\n'
    )
    done = app.pump_once(APP_FILE=str(schedules))
    assert "synced ops: 1 created" in done.stderr, done.stderr
    repeat = Repeat(client, prefix)
    # celery.backend_cleanup: Celery's own, installed as its beat does.
    assert sorted(repeat.names(app.queue)) == ["celery.backend_cleanup", "from-file", "kept"]
    assert repeat.get(app.queue, "from-file").source == "ops"  # type: ignore[union-attr]
    assert repeat.get(app.queue, "kept").source == "team"  # type: ignore[union-attr]
