"""django-celery-beat projects with `USE_TZ = False` store naive wall times in their
`TIME_ZONE`: the import reads them there, as django-celery-beat does, not as UTC (which
fired a clocked one-off set for local now+2h at once, 5 h early in New York).

Each project runs in a subprocess of its own (Django's settings are set once per process):
`manage.py emq_import` on SQLite and on PostgreSQL, and the command line from a database
URL, which is told the zone of a SQLite database's times (`--stored-timezone`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres import PG_ADMIN_URL, require_postgres

from emq_bridge import Repeat

ZONE = "America/New_York"

SEED = f"""
import json
import django
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

django.setup()
from django_celery_beat.models import ClockedSchedule, IntervalSchedule, PeriodicTask

now = datetime.now(timezone.utc)
local = now.astimezone(ZoneInfo({ZONE!r})).replace(tzinfo=None)  # what USE_TZ=False stores
hour = IntervalSchedule.objects.create(every=1, period="hours")
clocked = ClockedSchedule.objects.create(clocked_time=local + timedelta(hours=2))
PeriodicTask.objects.create(name="clocked", task="proj.run", clocked=clocked, one_off=True)
PeriodicTask.objects.create(
    name="hourly", task="proj.run", interval=hour, last_run_at=local - timedelta(minutes=30)
)
PeriodicTask.objects.create(
    name="later", task="proj.run", interval=hour, start_time=local + timedelta(hours=3),
    expires=local + timedelta(days=1),
)
ms = lambda value: int(value.timestamp() * 1000)
print(json.dumps({{
    "clocked": ms(now + timedelta(hours=2)),
    "hourly": ms(now + timedelta(minutes=30)),
    "later": ms(now + timedelta(hours=3)),
    "expires": ms(now + timedelta(days=1)),
}}))
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A project with USE_TZ = False in New York, django-celery-beat migrated, seeded."""
    backend = request.param
    name = f"emq_t{uuid.uuid4().hex[:10]}"
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'beat.sqlite3'}"
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "beat.sqlite3")}
    else:
        require_postgres()
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": "5432",
        }
    (tmp_path / "naive_settings.py").write_text(
        textwrap.dedent(f"""
        SECRET_KEY = "x"
        INSTALLED_APPS = ["django_celery_beat", "emq_bridge.celery.importers.django"]
        DATABASES = {{"default": {database!r}}}
        USE_TZ = False
        TIME_ZONE = {ZONE!r}
        """)
    )
    (tmp_path / "seed.py").write_text(SEED)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "naive_settings", "PYTHONPATH": str(tmp_path)}
    try:
        django = [sys.executable, "-m", "django", "migrate", "--verbosity=0"]
        subprocess.run(django, env=env, cwd=tmp_path, check=True, timeout=120)
        seeded = subprocess.run(
            [sys.executable, "seed.py"],
            env=env,
            cwd=tmp_path,
            check=True,
            timeout=60,
            capture_output=True,
            text=True,
        )
        yield {"url": url, "dir": str(tmp_path), "due": seeded.stdout, "backend": backend}
    finally:
        if backend == "postgresql":
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _check(repeat: Repeat, due: dict[str, int]) -> None:
    clocked = repeat.get("celery", "clocked")  # 2 h ahead, not 3 h behind
    assert clocked is not None and clocked.next_run_ms == pytest.approx(due["clocked"], abs=1000)
    hourly = repeat.get("celery", "hourly")  # an hour after its last run, 30 min ahead
    assert hourly is not None and hourly.next_run_ms == pytest.approx(due["hourly"], abs=1000)
    assert hourly.last_fired_ms == pytest.approx(due["hourly"] - 3_600_000, abs=1000)
    later = repeat.get("celery", "later")
    assert later is not None and later.next_run_ms == pytest.approx(due["later"], abs=1000)
    bounds = later.definition.bounds
    assert bounds.start_ms == pytest.approx(due["later"], abs=1000)
    assert bounds.end_ms == pytest.approx(due["expires"] - 1, abs=1000)


def test_the_management_command_reads_naive_times_in_the_projects_time_zone(
    project: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    command = [sys.executable, "-m", "django", "emq_import", "--redis-url", redis_url]
    command += ["--prefix", repeat.prefix]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "naive_settings", "PYTHONPATH": project["dir"]}
    done = subprocess.run(
        command, env=env, cwd=project["dir"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "3 created, 0 updated, 0 unchanged, 0 refused" in done.stderr
    _check(repeat, json.loads(project["due"]))


def test_the_command_line_reads_a_database_url_in_the_zone_it_is_told(
    project: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url]
    command += ["--prefix", repeat.prefix, "import", "django-celery-beat"]
    command += ["--database-url", project["url"]]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    if project["backend"] == "sqlite":
        # SQLite holds wall times with no zone: --stored-timezone says which (UTC, the default, is
        # what a USE_TZ = True project stores).
        command += ["--stored-timezone", ZONE]
    # PostgreSQL holds instants: read as they are, --stored-timezone unneeded.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "3 created, 0 updated, 0 unchanged, 0 refused" in done.stderr
    _check(repeat, json.loads(project["due"]))


def test_a_reimport_by_the_project_of_what_the_command_line_imported_changes_nothing(
    project: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    # Session 35 (a probe of a Django project's switch): the task's `expires` option, the
    # row's `expires`, was written as read: `+00:00` from PostgreSQL's instants, `-05:00`
    # from the project's naive wall times, so the same rows imported again from the project
    # (USE_TZ = False) were an update. Both now write the instant in UTC.
    first = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url]
    first += ["--prefix", repeat.prefix, "import", "django-celery-beat"]
    first += ["--database-url", project["url"]]
    if project["backend"] == "sqlite":
        first += ["--stored-timezone", ZONE]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(first, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    later = repeat.get("celery", "later")
    assert later is not None
    assert later.definition.template["options"]["expires"].endswith("+00:00")

    again = [sys.executable, "-m", "django", "emq_import", "--redis-url", redis_url]
    again += ["--prefix", repeat.prefix]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "naive_settings", "PYTHONPATH": project["dir"]}
    done = subprocess.run(
        again, env=env, cwd=project["dir"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "0 created, 0 updated, 3 unchanged, 0 refused" in done.stderr
