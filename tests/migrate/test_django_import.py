"""django-celery-beat -> emq-bridge, on PostgreSQL (a database of its own, dropped after) and
on SQLite: `PeriodicTask` rows made through django-celery-beat's models are imported by
`manage.py emq_import` (and by `emq-bridge import django-celery-beat --database-url`) with
their options, states, counters and start times; what cannot be carried is listed with the
reason; running the import again writes nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from postgres import PG_ADMIN_URL, require_postgres
from registry_state import snapshot

from emq_bridge import Repeat
from emq_bridge.cadence import Cron


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Django set up on a fresh SQLite file ("default") and a fresh PostgreSQL database
    ("pg"), django-celery-beat's tables migrated in both; the database is dropped after."""
    import psycopg

    require_postgres()
    import django
    from django.conf import settings
    from django.core.management import call_command

    name = f"emq_t{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    sqlite = tmp_path_factory.mktemp("django") / "beat.sqlite3"
    settings.configure(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite)},
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "USER": "postgres",
                "HOST": "127.0.0.1",
                "PORT": "5432",
            },
        },
        INSTALLED_APPS=["django_celery_beat", "emq_bridge.celery.importers.django"],
        USE_TZ=True,
        TIME_ZONE="UTC",
    )
    django.setup()
    try:
        for alias in ("default", "pg"):
            call_command("migrate", database=alias, verbosity=0)
        yield {
            "default": f"sqlite:///{sqlite}",
            "pg": f"postgresql://postgres@127.0.0.1:5432/{name}",
        }
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def make_rows(alias: str) -> dict[str, Any]:
    """Create one row per case through django-celery-beat's models in `alias`."""
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    db = PeriodicTask.objects.using(alias)
    now = datetime.now(timezone.utc)
    ten = IntervalSchedule.objects.using(alias).create(every=10, period="minutes")
    minute = IntervalSchedule.objects.using(alias).create(every=1, period="minutes")
    weekdays = CrontabSchedule.objects.using(alias).create(
        minute="30", hour="9", day_of_week="mon-fri", timezone="Europe/Paris"
    )
    solar, _ = SolarSchedule.objects.using(alias).get_or_create(
        event="sunset", latitude="48.85", longitude="2.35"
    )
    clocked = ClockedSchedule.objects.using(alias).create(clocked_time=now + timedelta(days=1))
    last = now - timedelta(minutes=3)
    rows = {
        "digest": dict(
            interval=ten,
            last_run_at=last,
            total_run_count=7,
            queue="reports",
            priority=5,
            args=json.dumps([1, "a"]),
            kwargs=json.dumps({"full": True}),
            headers=json.dumps({"tenant": "acme"}),
            expire_seconds=120,
        ),
        "Morning report": dict(crontab=weekdays),
        "disabled": dict(interval=minute, enabled=False, total_run_count=2),
        "later": dict(interval=minute, start_time=now + timedelta(hours=1)),
        "once": dict(interval=minute, one_off=True),
        "clocked": dict(clocked=clocked, one_off=True),
        "sunset": dict(solar=solar),
        "ends": dict(interval=minute, expires=now + timedelta(days=2)),
        "ended": dict(interval=minute, expires=now - timedelta(days=2)),
        "ran-once": dict(interval=minute, one_off=True, total_run_count=1),
    }
    for name, fields in rows.items():
        db.create(name=name, task="proj.tasks.run", **fields)
    return {"now": now, "last": last, "clocked": clocked.clocked_time}


def ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


@pytest.mark.parametrize("alias", ["default", "pg"], ids=["sqlite", "postgresql"])
def test_periodic_tasks_are_imported_with_states_and_bounds_and_again_changes_nothing(
    databases: dict[str, str], alias: str, repeat: Repeat, redis_url: str
) -> None:
    from django.core.management import call_command

    made = make_rows(alias)
    options = {"redis_url": redis_url, "prefix": repeat.prefix, "database": alias}
    out, err = io.StringIO(), io.StringIO()
    call_command("emq_import", stdout=out, stderr=err, **options)
    summary = "import import:django-celery-beat: 7 created, 0 updated, 0 unchanged, 3 refused"
    assert summary in err.getvalue()
    # As the CLI's import does: which queues a beat must pump for these to be sent.
    assert "note: the imported schedules are in queue(s) 'celery', 'reports'" in err.getvalue()

    digest = repeat.get("reports", "digest")
    assert digest is not None and digest.source == "import:django-celery-beat"
    assert digest.definition.cadence.describe() == "every 10m (from registration)"
    assert digest.next_run_ms == pytest.approx(ms(made["last"]) + 600_000, abs=1)  # its phase
    assert (digest.fired, digest.last_fired_ms) == (7, pytest.approx(ms(made["last"]), abs=1))
    assert dict(digest.definition.template) == {
        "task": "proj.tasks.run",
        "args": [1, "a"],
        "kwargs": {"full": True},
        "options": {
            "queue": "reports",
            "priority": 5,
            "expires": 120,
            "headers": {"tenant": "acme", "periodic_task_name": "digest"},
        },
    }
    morning = repeat.get("celery", "Morning_report")
    assert morning is not None and not morning.paused
    cadence = morning.definition.cadence
    assert isinstance(cadence, Cron) and (cadence.expr, cadence.tz) == (
        "30 9 * * 1,2,3,4,5",
        "Europe/Paris",
    )
    assert cadence.day_and is False
    assert morning.next_run_ms == cadence.next_after(morning.created_ms - 5000)
    disabled = repeat.get("celery", "disabled")
    assert disabled is not None and disabled.paused and disabled.fired == 2
    later = repeat.get("celery", "later")  # not before its start_time, a start bound too
    start_ms = ms(made["now"] + timedelta(hours=1))
    assert later is not None and later.next_run_ms == pytest.approx(start_ms, abs=1)
    assert later.definition.bounds.start_ms == pytest.approx(start_ms, abs=1)
    ends = repeat.get("celery", "ends")  # runs while now < expires: its last ms is the bound
    expires_ms = ms(made["now"] + timedelta(days=2))
    assert ends is not None and ends.definition.bounds.end_ms == pytest.approx(
        expires_ms - 1, abs=1
    )
    once = repeat.get("celery", "once")  # one_off: its next slot, once
    assert once is not None and once.definition.bounds.limit == 1 and once.remaining == 1
    clocked = repeat.get("celery", "clocked")  # a ClockedSchedule: a one-off at its instant
    assert clocked is not None and clocked.definition.cadence.describe().startswith("at ")
    assert clocked.next_run_ms == pytest.approx(ms(made["clocked"]), abs=1)

    refused = {
        line.split(":", 1)[0]: line for line in out.getvalue().splitlines() if line[0] == "!"
    }
    assert set(refused) == {f"! periodic task {n!r}" for n in ("sunset", "ended", "ran-once")}
    assert "solar('sunset', 48.85, 2.35)" in refused["! periodic task 'sunset'"]
    assert "expired at" in refused["! periodic task 'ended'"]
    assert "a one-off that already ran" in refused["! periodic task 'ran-once'"]

    state = snapshot(repeat)
    err = io.StringIO()
    call_command("emq_import", stdout=io.StringIO(), stderr=err, **options)
    assert "0 created, 0 updated, 7 unchanged, 3 refused" in err.getvalue()
    assert snapshot(repeat) == state

    from django_celery_beat.models import PeriodicTask

    PeriodicTask.objects.using(alias).all().delete()


@pytest.mark.parametrize("alias", ["default", "pg"], ids=["sqlite", "postgresql"])
def test_the_command_imports_from_a_database_url_outside_the_project(
    databases: dict[str, str], alias: str, redis_url: str, prefix: str
) -> None:
    from django_celery_beat.models import PeriodicTask

    make_rows(alias)
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["import", "django-celery-beat", "--database-url", databases[alias], "--json"]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    try:
        first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert first.returncode == 0, first.stderr
        result = json.loads(first.stdout)
        assert sorted(i["name"] for i in result["created"]) == [
            "Morning_report",
            "clocked",
            "digest",
            "disabled",
            "ends",
            "later",
            "once",
        ]
        assert len(result["refused"]) == 3
        again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert again.returncode == 0, again.stderr
        rerun = json.loads(again.stdout)
        assert (len(rerun["unchanged"]), rerun["created"], rerun["updated"]) == (7, [], [])
    finally:
        PeriodicTask.objects.using(alias).all().delete()


def test_a_bad_database_url_is_a_one_line_error(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["import", "django-celery-beat", "--database-url", "oracle://x/y"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: --database-url: unknown scheme 'oracle'; use postgresql://, mysql:// or "
        "sqlite:///path"
    ]


def test_a_bad_default_queue_is_refused_before_any_row_is_read(redis_url: str, prefix: str) -> None:
    # What `manage.py emq_import --queue` passes on: refused (a CommandError, one line)
    # rather than every row naming no queue refused and the others imported.
    from emq_bridge.celery.importers.django.reader import read_periodic_tasks
    from emq_bridge.errors import InvalidName

    with pytest.raises(InvalidName, match="must not contain"):
        read_periodic_tasks(now_ms=0, queue="a{b")
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["import", "django-celery-beat", "--database-url", "sqlite:///x", "--queue", ""]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Invalid value for '--queue': queue must not be empty" in result.stderr


def test_a_row_celery_refuses_is_listed_with_the_reason_and_the_others_are_read(
    databases: dict[str, str],
) -> None:
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

    from emq_bridge.celery.importers.django.reader import read_periodic_tasks

    never = CrontabSchedule.objects.using("default").create(
        minute="0", hour="0", day_of_month="30", month_of_year="2"
    )
    minute = IntervalSchedule.objects.using("default").create(every=1, period="minutes")
    micro = IntervalSchedule.objects.using("default").create(every=1, period="microseconds")
    db = PeriodicTask.objects.using("default")
    db.create(name="feb-30", task="proj.tasks.run", crontab=never)
    db.create(name="micro", task="proj.tasks.run", interval=micro)
    db.create(name="fine", task="proj.tasks.run", interval=minute)
    # JSON null, which django-celery-beat runs as no arguments: imported as none.
    nulls = {"args": "null", "kwargs": "null", "headers": "null"}
    db.create(name="nulls", task="proj.tasks.run", interval=minute, **nulls)
    try:
        plan = read_periodic_tasks(now_ms=ms(datetime.now(timezone.utc)), using="default")
        assert sorted(e.declaration.name for e in plan.entries) == ["fine", "nulls"]
        by_name = {e.declaration.name: e.declaration.definition.template for e in plan.entries}
        assert (by_name["nulls"]["args"], by_name["nulls"]["kwargs"]) == ([], {})
        assert by_name["nulls"]["options"] == {"headers": {"periodic_task_name": "nulls"}}
        reasons = {r.origin: r.reason for r in plan.refused}
        assert set(reasons) == {"periodic task 'feb-30'", "periodic task 'micro'"}
        assert reasons["periodic task 'feb-30'"].startswith("Celery refuses it: ")
        assert "never occurs" in reasons["periodic task 'feb-30'"]
        assert not reasons["periodic task 'micro'"].startswith("periodic task")  # named once
    finally:
        db.all().delete()


def test_a_crontab_in_a_zone_this_machine_does_not_know_is_refused_alone(
    databases: dict[str, str],
) -> None:
    # Session 27's probe: django-timezone-field raises while the rows are read for a zone
    # tzdata does not know (a typo, an older tzdata), which ended the import in a traceback
    # of some 60 lines, every good row with it.
    from django.db import connections
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

    from emq_bridge.celery.importers.django.reader import read_periodic_tasks

    mars = CrontabSchedule.objects.using("default").create(minute="0", hour="3", timezone="UTC")
    paris = CrontabSchedule.objects.using("default").create(
        minute="0", hour="3", timezone="Europe/Paris"
    )
    minute = IntervalSchedule.objects.using("default").create(every=1, period="minutes")
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_crontabschedule SET timezone = %s WHERE id = %s",
            ["Mars/Olympus", mars.id],
        )
    db = PeriodicTask.objects.using("default")
    db.create(name="on-mars", task="proj.tasks.run", crontab=mars)
    db.create(name="in-paris", task="proj.tasks.run", crontab=paris)
    db.create(name="fine", task="proj.tasks.run", interval=minute)
    try:
        plan = read_periodic_tasks(now_ms=ms(datetime.now(timezone.utc)), using="default")
        assert sorted(e.declaration.name for e in plan.entries) == ["fine", "in-paris"]
        [paris_entry] = [e for e in plan.entries if e.declaration.name == "in-paris"]
        cadence = paris_entry.declaration.definition.cadence
        assert isinstance(cadence, Cron) and cadence.tz == "Europe/Paris"
        reasons = {r.origin: r.reason for r in plan.refused}
        assert reasons == {
            "periodic task 'on-mars'": "its crontab's timezone 'Mars/Olympus' is not a time "
            "zone this machine knows (an IANA name, from tzdata)"
        }
    finally:
        db.all().delete()
        with connections["default"].cursor() as cursor:  # the model cannot load "on-mars"'s
            cursor.execute(
                "DELETE FROM django_celery_beat_crontabschedule WHERE id IN (%s, %s)",
                [mars.id, paris.id],
            )


def test_a_row_whose_task_name_holds_a_line_break_is_refused(databases: dict[str, str]) -> None:
    # Imported before (session 25's probe found it with redbeat): a schedule file refuses
    # such a name, so `export` then left the schedule out.
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from emq_bridge.celery.importers.django.reader import read_periodic_tasks

    minute = IntervalSchedule.objects.using("default").create(every=1, period="minutes")
    db = PeriodicTask.objects.using("default")
    db.create(name="broken", task="proj.tasks.run\nproj.tasks.other", interval=minute)
    db.create(name="fine", task="proj.tasks.run", interval=minute)
    try:
        plan = read_periodic_tasks(now_ms=ms(datetime.now(timezone.utc)), using="default")
        assert [e.declaration.name for e in plan.entries] == ["fine"]
        reasons = {r.origin: r.reason for r in plan.refused}
        assert list(reasons) == ["periodic task 'broken'"]
        assert "must not contain control characters" in reasons["periodic task 'broken'"]
    finally:
        db.all().delete()


def test_a_row_whose_name_cannot_be_a_registration_name_is_refused_naming_its_name(
    databases: dict[str, str],
) -> None:
    # Session 39's input probe: the reason said `beat_schedule['x\u202ey']: ...`, a
    # setting the import never read.
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from emq_bridge.celery.importers.django.reader import read_periodic_tasks

    minute = IntervalSchedule.objects.using("default").create(every=1, period="minutes")
    db = PeriodicTask.objects.using("default")
    db.create(name="x\u202ey", task="proj.tasks.run", interval=minute)
    try:
        plan = read_periodic_tasks(now_ms=ms(datetime.now(timezone.utc)), using="default")
        [refusal] = plan.refused
        assert refusal.reason.startswith("its name: "), refusal.reason
        assert "beat_schedule" not in refusal.reason
    finally:
        db.all().delete()


def test_rows_the_database_cannot_give_back_are_refused_alone_and_the_others_imported(
    databases: dict[str, str], redis_url: str, prefix: str
) -> None:
    # Session 39's input probe: SQLite keeps any text in a date column, and a name that is not
    # UTF-8; Django (or the driver) then raised while reading every row, so one such row ended
    # the import in a traceback (or an error that blamed the database), every good row with it.
    # So did a date that is no date at all, and a foreign key to a schedule deleted by hand.
    from django.db import connections
    from django_celery_beat.models import ClockedSchedule, IntervalSchedule, PeriodicTask

    from emq_bridge.celery.importers.django.reader import read_periodic_tasks

    minute = IntervalSchedule.objects.using("default").create(every=1, period="minutes")
    gone = IntervalSchedule.objects.using("default").create(every=2, period="minutes")
    clocked = ClockedSchedule.objects.using("default").create(
        clocked_time=datetime.now(timezone.utc) + timedelta(days=1)
    )
    db = PeriodicTask.objects.using("default")
    db.create(name="fine", task="proj.tasks.run", interval=minute)
    broken = {
        column: db.create(name=f"bad-{column}", task="proj.tasks.run", interval=minute)
        for column in ("last_run_at", "start_time", "expires", "date_changed")
    }
    db.create(name="dangling", task="proj.tasks.run", interval=gone)
    db.create(name="not-a-date", task="proj.tasks.run", clocked=clocked, one_off=True)
    not_utf8 = db.create(name="not-utf8", task="proj.tasks.run", interval=minute)
    table = "django_celery_beat_periodictask"
    try:
        with connections["default"].cursor() as cursor:
            for column, row in broken.items():
                cursor.execute(
                    f"UPDATE {table} SET {column} = '2030-02-30 00:00:00' WHERE id = %s", [row.id]
                )
            cursor.execute("PRAGMA foreign_keys = OFF")
            cursor.execute(
                "DELETE FROM django_celery_beat_intervalschedule WHERE id = %s", [gone.id]
            )
            cursor.execute(
                "UPDATE django_celery_beat_clockedschedule SET clocked_time = 'not a date' "
                "WHERE id = %s",
                [clocked.id],
            )
            cursor.execute(f"UPDATE {table} SET name = X'61ff62' WHERE id = %s", [not_utf8.id])
        plan = read_periodic_tasks(now_ms=ms(datetime.now(timezone.utc)), using="default")
        assert [e.declaration.name for e in plan.entries] == ["fine"]
        reasons = {r.origin: r.reason for r in plan.refused}
        for column in broken:
            assert (
                "its row cannot be read (ValueError: " in reasons[f"periodic task 'bad-{column}'"]
            )
        assert reasons["periodic task 'dangling'"] == (
            f"its interval (id {gone.id}) does not exist"
        )
        assert reasons["periodic task 'not-a-date'"] == "its clocked time is not a date"
        # Read as bytes here, or not at all by the command's driver (below): refused either way.
        [unreadable] = [r for r in reasons if r.startswith("periodic task b")]
        assert reasons[unreadable] == "its name is not text (UTF-8)"
        assert len(reasons) == 7, reasons
        # The command: the refusals listed with `!`, no traceback, the good row planned.
        result = _import_from(databases["default"], redis_url, prefix)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
        assert result.stdout.count("! periodic task") == 7, result.stdout
        assert "+ celery/fine" in result.stdout or "fine" in result.stdout, result.stdout
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(f"DELETE FROM {table}")
            cursor.execute("DELETE FROM django_celery_beat_clockedschedule")
            cursor.execute("PRAGMA foreign_keys = ON")


def _import_from(url: str, redis_url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["import", "django-celery-beat", "--database-url", url, "--dry-run"]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_a_database_that_cannot_be_read_is_a_one_line_error_and_creates_nothing(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.sqlite3"
    result = _import_from(f"sqlite:///{missing}", redis_url, prefix)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Error: --database-url: no SQLite database file '{missing}'"
    ]
    assert not missing.exists()  # a dry run leaves no empty database behind

    empty = tmp_path / "empty.sqlite3"
    empty.write_bytes(b"")  # a SQLite database with no table
    bare = _import_from(f"sqlite:///{empty}", redis_url, prefix)
    assert bare.returncode == 1, bare.stderr
    [line] = bare.stderr.strip().splitlines()
    assert line.startswith("Error: cannot read django-celery-beat's periodic tasks (")
    assert "no such table" in line and "migrations applied?" in line

    require_postgres()
    for url, said in (
        ("postgresql://postgres@127.0.0.1:5432/postgres", "does not exist"),  # no such tables
        ("postgresql://postgres:secret@127.0.0.1:1/test", "OperationalError"),  # nobody there
    ):
        result = _import_from(url, redis_url, prefix)
        assert result.returncode == 1, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("Error: cannot read django-celery-beat's periodic tasks (")
        assert said in line and "secret" not in line


def test_a_reimport_once_a_start_time_passed_changes_nothing(
    databases: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    # Before: the start bound was carried only while the start_time was ahead, so the first
    # re-import after it passed was an update, re-seeded from the row's stale last run: the
    # start slot was sent a second time, with another id.
    import time

    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    minute = IntervalSchedule.objects.using("default").create(every=1, period="minutes")
    start = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    PeriodicTask.objects.using("default").create(
        name="starts-soon", task="proj.tasks.run", interval=minute, start_time=start
    )
    options = {"redis_url": redis_url, "prefix": repeat.prefix, "database": "default"}
    try:
        call_command("emq_import", stdout=io.StringIO(), stderr=io.StringIO(), **options)
        state = snapshot(repeat)
        time.sleep(max(0.0, start.timestamp() - time.time()) + 0.5)  # the start passed
        err = io.StringIO()
        call_command("emq_import", stdout=io.StringIO(), stderr=err, **options)
        assert "0 created, 0 updated, 1 unchanged" in err.getvalue(), err.getvalue()
        assert snapshot(repeat) == state
        registration = repeat.get("celery", "starts-soon")
        assert registration is not None
        assert registration.definition.bounds.start_ms == pytest.approx(ms(start), abs=1)
    finally:
        PeriodicTask.objects.using("default").all().delete()


@pytest.mark.parametrize(
    "extra",
    [{}, {"one_off": True}, {"last_run_at": "recent"}, {"start": "on a slot"}],
    ids=["plain", "one-off", "ran-lately", "start-on-a-slot"],
)
def test_a_crontab_with_a_start_time_ahead_first_runs_at_its_first_slot_from_then(
    databases: dict[str, str], repeat: Repeat, redis_url: str, extra: dict[str, Any]
) -> None:
    # Found by a probe (session 38): the row's first run was its start_time itself, which is
    # no slot of its crontab (an admin's start of 09:15 on `0 9-17 * * *` fired at 09:15);
    # django-celery-beat waits for the first slot from then (`PeriodicTask.due_start_time`).
    from django.core.management import call_command
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    now = datetime.now(timezone.utc)
    hourly = CrontabSchedule.objects.using("default").create(
        minute="0", hour="*/3", timezone="Europe/Paris"
    )
    fields = dict(extra)
    if fields.get("last_run_at") == "recent":
        fields["last_run_at"] = now - timedelta(minutes=5)
    start = now + timedelta(hours=4, minutes=15)
    if fields.pop("start", None):  # a start on one of its slots: the peer waits for the next
        slot_ms = Cron("0 */3 * * *", "Europe/Paris").next_after(ms(start))
        start = datetime.fromtimestamp(slot_ms / 1000, timezone.utc)
    row = PeriodicTask.objects.using("default").create(
        name="later-cron",
        task="proj.tasks.run",
        crontab=hourly,
        start_time=start,
        **fields,
    )
    options = {"redis_url": redis_url, "prefix": repeat.prefix, "database": "default"}
    try:
        call_command("emq_import", stdout=io.StringIO(), stderr=io.StringIO(), **options)
        registration = repeat.get("celery", "later-cron")
        assert registration is not None
        peer_first = row.due_start_time(timezone.utc)  # the peer's own answer
        assert registration.next_run_ms == ms(peer_first)
        assert registration.definition.bounds.start_ms == pytest.approx(ms(row.start_time), abs=1)
    finally:
        PeriodicTask.objects.using("default").all().delete()


def test_a_crontab_whose_start_time_passed_and_that_missed_a_slot_fires_at_once_as_the_peer(
    databases: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    # The other side of the test above: once the start passed, django-celery-beat asks the
    # crontab's is_due from the last run, and a slot missed since is due now.
    from django.core.management import call_command
    from django_celery_beat.models import CrontabSchedule, PeriodicTask
    from django_celery_beat.schedulers import ModelEntry

    now = datetime.now(timezone.utc)
    daily = CrontabSchedule.objects.using("default").create(
        minute="0", hour="3", timezone="Europe/Paris"
    )
    row = PeriodicTask.objects.using("default").create(
        name="missed-cron",
        task="proj.tasks.run",
        crontab=daily,
        start_time=now - timedelta(minutes=10),
        last_run_at=now - timedelta(days=2),
    )
    options = {"redis_url": redis_url, "prefix": repeat.prefix, "database": "default"}
    try:
        assert ModelEntry(row).is_due().is_due  # the peer would send it now
        call_command("emq_import", stdout=io.StringIO(), stderr=io.StringIO(), **options)
        registration = repeat.get("celery", "missed-cron")
        assert registration is not None and registration.next_run_ms is not None
        assert registration.next_run_ms <= ms(datetime.now(timezone.utc))
    finally:
        PeriodicTask.objects.using("default").all().delete()


def test_a_task_enabled_again_in_django_celery_beat_gets_the_resume_command_on_reimport(
    databases: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    # Session 35 (a probe of a Django project's switch): a task disabled when it was imported
    # (created paused here) and enabled again in the admin, django-celery-beat's usual way,
    # was listed as unchanged and paused with no word on why (an import leaves a pause as it
    # is); the opposite case named `emq-bridge pause`. An import's own `--paused` staging is
    # lifted by `--resume`, and gets no such line.
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    hour = IntervalSchedule.objects.using("default").create(every=1, period="hours")
    tasks = PeriodicTask.objects.using("default")
    tasks.create(name="off-then-on", task="proj.tasks.run", interval=hour, enabled=False)
    tasks.create(name="staged", task="proj.tasks.run", interval=hour)
    options = {"redis_url": redis_url, "prefix": repeat.prefix, "database": "default"}
    try:
        call_command("emq_import", stdout=io.StringIO(), stderr=io.StringIO(), **options)
        repeat.cancel("celery", "staged")
        call_command(
            "emq_import", stdout=io.StringIO(), stderr=io.StringIO(), paused=True, **options
        )
        tasks.filter(name="off-then-on").update(enabled=True)
        out, err = io.StringIO(), io.StringIO()
        call_command("emq_import", stdout=out, stderr=err, **options)
        lines = (out.getvalue() + err.getvalue()).splitlines()
        hint = "enabled in the old scheduler but paused here"
        again = [line for line in lines if "celery/off-then-on" in line]
        assert len(again) == 1 and hint in again[0], lines
        assert "): emq-bridge resume celery off-then-on  <- periodic task" in again[0]
        staged = [line for line in lines if "celery/staged" in line]
        assert len(staged) == 1 and hint not in staged[0], lines
        registration = repeat.get("celery", "off-then-on")
        assert registration is not None and registration.paused  # the hint only
    finally:
        PeriodicTask.objects.using("default").all().delete()


def test_a_one_off_django_celery_beat_ran_is_refused_by_both_imports(
    databases: dict[str, str], repeat: Repeat, redis_url: str
) -> None:
    # Before: once its beat ran a one-off, the row is disabled with no run count and no last
    # run (its save() clears last_run_at): it was imported paused with 1 run remaining, and a
    # `resume --source import:django-celery-beat` sent it a second time.
    from celery import Celery
    from django.core.management import call_command
    from django_celery_beat.models import ClockedSchedule, IntervalSchedule, PeriodicTask
    from django_celery_beat.schedulers import ModelEntry

    db = PeriodicTask.objects.using("default")
    now = datetime.now(timezone.utc)
    second = IntervalSchedule.objects.using("default").create(every=1, period="seconds")
    clocks = ClockedSchedule.objects.using("default")
    passed = clocks.create(clocked_time=now - timedelta(seconds=1))
    ahead = clocks.create(clocked_time=now + timedelta(hours=1))
    db.create(name="ran-iv", task="proj.tasks.run", interval=second, one_off=True)
    db.create(name="ran-clocked", task="proj.tasks.run", clocked=passed, one_off=True)
    db.create(name="ran-bulk", task="proj.tasks.run", interval=second, one_off=True)
    db.create(name="held", task="proj.tasks.run", clocked=ahead, one_off=True, enabled=False)
    db.create(name="todo", task="proj.tasks.run", interval=second, one_off=True)
    app = Celery("dcb", set_as_current=False)
    for name in ("ran-iv", "ran-clocked", "ran-bulk"):
        # What its beat does with a due one-off: send it (next: last_run_at, a run counted),
        # save it at the sync, then disable it at its next check.
        sent = next(ModelEntry(db.get(name=name), app=app))
        sent.save()
        if name != "ran-bulk":
            assert not sent.is_due().is_due
    # The row as a bulk update leaves it (the admin's "toggle" action): only its last run.
    db.filter(name="ran-bulk").update(enabled=False, total_run_count=0)
    rows = {r.name: (r.enabled, r.total_run_count, r.last_run_at is None) for r in db.all()}
    assert rows["ran-iv"] == rows["ran-clocked"] == (False, 0, True)
    assert rows["ran-bulk"] == (False, 0, False)

    options = {"redis_url": redis_url, "prefix": repeat.prefix, "database": "default"}
    try:
        out, err = io.StringIO(), io.StringIO()
        call_command("emq_import", stdout=out, stderr=err, **options)
        assert "2 created, 0 updated, 0 unchanged, 3 refused" in err.getvalue(), err.getvalue()
        refused = [line for line in out.getvalue().splitlines() if line.startswith("!")]
        assert sorted(line.split(":", 1)[0] for line in refused) == [
            f"! periodic task {n!r}" for n in ("ran-bulk", "ran-clocked", "ran-iv")
        ]
        assert all(len(line.split("\n")) == 1 for line in refused)
        assert "a one-off that already ran (last at " in "".join(refused)
        assert "a disabled one-off: django-celery-beat disables a one-off once it ran" in (
            "".join(refused)
        )
        for name in ("ran-iv", "ran-clocked", "ran-bulk"):
            assert repeat.get("celery", name) is None  # nothing a resume could send again
        held = repeat.get("celery", "held")  # disabled, its clock still ahead: it has not run
        assert held is not None and held.paused
        todo = repeat.get("celery", "todo")
        assert todo is not None and not todo.paused and todo.remaining == 1

        # The command line reads the same rows the same way.
        cli = _import_from(databases["default"], redis_url, repeat.prefix)
        assert cli.returncode == 0, cli.stderr
        assert "0 created, 0 updated, 2 unchanged, 3 refused" in cli.stderr
        assert (
            sum(line.startswith("! periodic task 'ran-") for line in cli.stdout.splitlines()) == 3
        )
    finally:
        db.all().delete()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:Pg5ecret@127.0.0.1:notaport/db",
        "postgresql://u:Pg5ecret@[::1/db",
        "postgresql://u:Pg5/ecret@127.0.0.1/db",
    ],
    ids=["port", "ipv6", "slash-in-password"],
)
def test_a_database_url_whose_host_or_port_cannot_be_read_is_a_one_line_error(
    redis_url: str, prefix: str, url: str
) -> None:
    # Session 34 (a probe of secrets): a raw ValueError traceback, exit 1; with a '/' in the
    # password, urllib takes a piece of it for the port and quotes it in its message.
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["import", "django-celery-beat", "--database-url", url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: --database-url is not a valid URL: its host or port cannot be read (escape the "
        "password's special characters as %XX)"
    ]
    assert "ecret" not in result.stderr
