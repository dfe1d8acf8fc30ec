"""An import names, on one `note:` line (stderr), the queues its schedules are in: a `celery
beat -S emq` pumps a queue only if it is one of the app's or listed in `emq_bridge_queues`,
so a schedule imported into another queue (an entry's `options={"queue": ...}`, a periodic
task's `queue` field, a `--queue` that is not the app's default queue) would never be sent,
and nothing else would say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry
from registry_state import snapshot

from emq_bridge import Repeat
from emq_bridge.celery import RepeatScheduler
from emq_bridge.testing import ManualClock

HOW = (
    ": a celery beat -S emq pumps a queue only if it is one of the app's (its schedules' "
    "queues, task_default_queue, task_queues) or listed in its emq_bridge_queues setting"
)


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("note:")]


@pytest.fixture
def redbeat_app(redis_url: str) -> Iterator[Celery]:
    app = Celery("rbq", broker=redis_url, set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, redbeat_key_prefix=f"rb{uuid.uuid4().hex[:8]}:")
    yield app


def test_a_redbeat_import_names_the_queues_its_schedules_are_in(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    every = schedule(timedelta(minutes=5))
    RedBeatSchedulerEntry("plain", "app.t", every, app=redbeat_app).save()
    RedBeatSchedulerEntry(
        "routed", "app.t", every, options={"queue": "other"}, app=redbeat_app
    ).save()
    relative = schedule(timedelta(minutes=1), relative=True)  # refused: in no queue
    RedBeatSchedulerEntry(
        "relative", "app.t", relative, options={"queue": "x"}, app=redbeat_app
    ).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)

    dry = run(*args, "--queue", "main", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert notes(dry.stderr) == [
        "note: the imported schedules would be in queue(s) 'main', 'other'" + HOW
    ]
    assert snapshot(repeat) == {}

    done = run(*args, "--queue", "main")
    assert done.exit_code == 0, done.output
    assert "2 created, 0 updated, 0 unchanged, 1 refused" in done.stderr  # 'x': not named
    assert notes(done.stderr) == [
        "note: the imported schedules are in queue(s) 'main', 'other'" + HOW
    ]
    # Just before the summary, which stays the last line.
    assert done.stderr.strip().splitlines()[-2:] == [
        notes(done.stderr)[0],
        "import import:redbeat: 2 created, 0 updated, 0 unchanged, 1 refused",
    ]
    assert {(r.queue, r.name) for q in ("main", "other") for r in repeat.iter_list(q)} == {
        ("main", "plain"),
        ("other", "routed"),
    }

    # Unchanged, the schedules are still in those queues: said again. With --json, stdout
    # is the JSON alone and the note is on stderr.
    as_json = run(*args, "--queue", "main", "--json")
    assert as_json.exit_code == 0, as_json.output
    assert len(json.loads(as_json.stdout)["unchanged"]) == 2
    assert notes(as_json.stderr) == notes(done.stderr)


def test_an_import_that_carries_nothing_has_no_queue_note(
    run: Run, redis_url: str, redbeat_app: Celery
) -> None:
    relative = schedule(timedelta(minutes=1), relative=True)
    RedBeatSchedulerEntry("relative", "app.t", relative, app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "0 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
    assert notes(result.stderr) == []


SETTINGS = """
SECRET_KEY = "t"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "beat.sqlite3"}}
USE_TZ = True
TIME_ZONE = "UTC"
"""
ROWS = textwrap.dedent("""
    import django

    django.setup()
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=10, period="minutes")
    PeriodicTask.objects.create(name="plain", task="app.t", interval=every)
    PeriodicTask.objects.create(name="routed", task="app.t", interval=every, queue="reports")
""")


def test_a_django_celery_beat_import_names_the_queues_its_schedules_are_in(
    tmp_path: Path, repeat: Repeat, redis_url: str, prefix: str
) -> None:
    # django-celery-beat's tables in a SQLite file, made in processes of their own (Django's
    # settings are configured once per process, and other tests configure their own).
    (tmp_path / "settings.py").write_text(SETTINGS)
    (tmp_path / "rows.py").write_text(ROWS)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settings", "PYTHONPATH": str(tmp_path)}
    for command in (["-m", "django", "migrate", "--verbosity=0"], ["rows.py"]):
        made = subprocess.run(
            [sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert made.returncode == 0, made.stderr
    env.pop("DJANGO_SETTINGS_MODULE")
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["import", "django-celery-beat", "--queue", "main"]
    command += ["--database-url", f"sqlite:///{tmp_path}/beat.sqlite3"]
    result = subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "2 created, 0 updated, 0 unchanged, 0 refused" in result.stderr
    assert notes(result.stderr) == [
        "note: the imported schedules are in queue(s) 'main', 'reports'" + HOW
    ]
    assert repeat.get("main", "plain") is not None and repeat.get("reports", "routed") is not None


def broker_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The task messages waiting in a Redis-broker queue (all priority lists)."""
    found = []
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        found += [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    return found


@pytest.mark.parametrize("listed", [False, True], ids=["not-listed", "in-emq_bridge_queues"])
def test_a_beat_pumps_an_imported_queue_only_if_it_is_the_apps_or_listed(
    run: Run,
    client: redis.Redis,
    redis_url: str,
    prefix: str,
    redbeat_app: Celery,
    listed: bool,
) -> None:
    # What the note warns of: the beat of an app whose default queue is `main` sends the
    # schedule imported into `main`, and the one imported into `other` only when the app's
    # emq_bridge_queues lists it.
    main, other = f"{prefix}-main", f"{prefix}-other"
    every = schedule(timedelta(seconds=1))  # never ran: due at once
    RedBeatSchedulerEntry("plain", "app.t", every, app=redbeat_app).save()
    RedBeatSchedulerEntry(
        "routed", "app.t", every, options={"queue": other}, app=redbeat_app
    ).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    imported = run(
        "import", "redbeat", "--from", redis_url, "--prefix", key_prefix, "--queue", main
    )
    assert imported.exit_code == 0, imported.output
    assert f"note: the imported schedules are in queue(s) '{main}', '{other}'" in imported.stderr

    app = Celery(f"beatq-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=main,
        emq_bridge_prefix=prefix,
        beat_schedule={},
        result_backend=None,
        result_expires=None,
        **({"emq_bridge_queues": [other]} if listed else {}),
    )
    scheduler = RepeatScheduler(app)
    try:
        assert scheduler.pump is not None
        clock = ManualClock(scheduler.pump.repeat.server_time_ms())
        scheduler.pump.clock = clock
        for _ in range(3):
            clock.advance(1000)
            scheduler.tick()
    finally:
        scheduler.close()
        app.close()
    sent = {
        q: {m["headers"]["emq_schedule"] for m in broker_messages(client, q)} for q in (main, other)
    }
    assert sent[main] == {f"{main}/plain"}
    assert sent[other] == ({f"{other}/routed"} if listed else set())
