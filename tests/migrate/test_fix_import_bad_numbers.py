"""A celery-redbeat entry whose stored last run is 9999-12-31 23:59:59 (so its next run would be
in year 10000) is refused with `!` and its reason, and nothing of it is written; the good entry
beside it is imported. Before, the import wrote the entry and then ended in a traceback while
listing it (`ValueError: year 10000 is out of range`, exit 1). The same for a
django-celery-beat row. A registration such an import already wrote is listed by a later
import with its stored next run, not a traceback.

A redbeat schedule with a number celery-redbeat or dateutil cannot use (an interval `every`
of 1e300, Infinity or "abc"; an rrule `freq` of 99, a weekday of 99) and a django-celery-beat
interval no timedelta holds are refused the same way, with `--dry-run` too. Before, each ended
the import in a traceback (`OverflowError`, `AttributeError`, `KeyError`, `IndexError`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.schedules import crontab, schedule
from cli_run import Run
from redbeat.decoder import RedBeatJSONEncoder
from registry_state import snapshot

from emq_bridge import Repeat
from emq_bridge.celery.importers.redbeat import importer_app, read_redbeat
from emq_bridge.registry import Seed

LAST_OF_9999 = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
SCHEDULES: dict[str, Any] = {
    "interval": schedule(timedelta(minutes=1)),
    "crontab": crontab(minute=0, hour=3),
}


def store(old: tuple[redis.Redis, str], name: str, value: Any, last_run: datetime | None) -> None:
    """Store one entry as celery-redbeat writes it: its hash and its index member."""
    client, key_prefix = old
    definition = {"name": name, "task": "rbt.record", "schedule": value}
    meta = {} if last_run is None else {"last_run_at": last_run, "total_run_count": 3}
    fields = {"definition": definition, "meta": meta}
    client.hset(
        key_prefix + name,
        mapping={k: json.dumps(v, cls=RedBeatJSONEncoder) for k, v in fields.items()},
    )
    client.zadd(key_prefix + ":schedule", {key_prefix + name: 0})


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
@pytest.mark.parametrize("mode", ["write", "--dry-run", "--strict"])
def test_an_entry_last_run_at_the_end_of_9999_is_refused_and_nothing_of_it_written(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str], kind: str, mode: str
) -> None:
    store(old, "good", schedule(timedelta(minutes=1)), None)
    store(old, "late", SCHEDULES[kind], LAST_OF_9999)
    flags = [] if mode == "write" else [mode]
    result = run("import", "redbeat", "--from", redis_url, "--prefix", old[1], *flags)

    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if mode == "--strict":
        assert result.exit_code == 1
        assert "1 schedule(s) cannot be imported" in result.stderr
        assert "past the end of 9999" in result.stderr
        assert snapshot(repeat) == {}
        return
    assert result.exit_code == 0, result.output
    refused = [line for line in result.stdout.splitlines() if line.startswith("!")]
    assert len(refused) == 1 and f"redbeat {old[1]}late: its next run after" in refused[0]
    assert "(past the end of 9999)" in refused[0]
    assert "1 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
    if mode == "--dry-run":
        assert snapshot(repeat) == {}
    else:
        assert repeat.names("celery") == ["good"]


def test_a_registration_stored_with_a_next_run_past_9999_is_listed_not_a_traceback(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str]
) -> None:
    # What the import wrote before it refused such an entry: the seed of year 10000.
    store(old, "late", schedule(timedelta(minutes=1)), datetime.now(timezone.utc))
    plan = read_redbeat(
        old[0], app=importer_app(), now_ms=repeat.server_time_ms(), key_prefix=old[1]
    )
    (entry,) = plan.entries
    d = entry.declaration
    year_10000_ms = 253_402_300_859_000
    repeat.upsert_many(
        [(d.queue, d.name, d.definition)], source=plan.source, seeds=[Seed(year_10000_ms)]
    )

    result = run("import", "redbeat", "--from", redis_url, "--prefix", old[1])

    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    # Scored past 9999, it has no run left (session 36: `next_run_ms` None, not the score).
    assert "no run left (as stored)" in result.stdout, result.stdout
    assert "0 created, 0 updated, 1 unchanged, 0 refused" in result.stderr


# A django-celery-beat database in SQLite, in a process of its own (Django is set up once per
# process, and test_django_import sets it up on its databases): a one-minute interval that
# never ran, one whose last run is the last second of 9999, and one of 2**31 - 1 days.
MAKE_ROWS = textwrap.dedent("""
    import sys
    from datetime import datetime, timezone
    from emq_bridge.celery.importers.django.standalone import setup

    setup("sqlite:///" + sys.argv[1])
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    minute = IntervalSchedule.objects.create(every=1, period="minutes")
    PeriodicTask.objects.create(name="good", task="proj.t", interval=minute)
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
    PeriodicTask.objects.create(name="late", task="proj.t", interval=minute, last_run_at=last)
    huge = IntervalSchedule.objects.create(every=2**31 - 1, period="days")
    PeriodicTask.objects.create(name="huge", task="proj.t", interval=huge)
""")


def test_django_rows_with_numbers_out_of_range_are_refused_and_nothing_of_them_written(
    repeat: Repeat, redis_url: str, tmp_path: Path
) -> None:
    database = tmp_path / "beat.sqlite3"
    database.touch()
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    made = subprocess.run(
        [sys.executable, "-c", MAKE_ROWS, str(database)], capture_output=True, text=True, env=env
    )
    assert made.returncode == 0, made.stderr
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url]
    command += ["--prefix", repeat.prefix, "import", "django-celery-beat"]
    command += ["--database-url", f"sqlite:///{database}"]

    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    refused = sorted(line for line in result.stdout.splitlines() if line.startswith("!"))
    assert len(refused) == 2, result.stdout
    assert refused[0].startswith("! periodic task 'huge': Celery refuses it: ")
    assert "periodic task 'late': its next run after" in refused[1]
    assert "(past the end of 9999)" in refused[1]
    assert "1 created, 0 updated, 0 unchanged, 2 refused" in result.stderr
    assert repeat.names("celery") == ["good"]


DTSTART = 1_704_067_200  # 2024-01-01 UTC, as celery-redbeat stores an rrule's dtstart
BAD_SCHEDULES = {
    "every-1e300": '{"__type__": "interval", "every": 1e300, "relative": false}',
    "every-infinity": '{"__type__": "interval", "every": Infinity, "relative": false}',
    "every-1e40": '{"__type__": "interval", "every": 1e40, "relative": false}',
    "every-abc": '{"__type__": "interval", "every": "abc", "relative": false}',
    "rrule-freq-99": f'{{"__type__": "rrule", "freq": 99, "dtstart": {DTSTART}, "interval": 1}}',
    # An interval of 0: dateutil repeats dtstart for ever (it was imported as every 1d).
    "rrule-interval-0": f'{{"__type__": "rrule", "freq": 3, "dtstart": {DTSTART}, "interval": 0}}',
    "rrule-wkday-99": (
        f'{{"__type__": "rrule", "freq": 1, "dtstart": {DTSTART}, "interval": 1, '
        '"byweekday": [{"__type__": "weekday", "wkday": 99, "n": 2}]}'
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEDULES))
@pytest.mark.parametrize("mode", ["write", "--dry-run"])
def test_a_schedule_with_a_number_out_of_range_is_refused_and_the_good_one_imported(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str], case: str, mode: str
) -> None:
    client, key_prefix = old
    store(old, "good", schedule(timedelta(minutes=1)), None)
    definition = f'{{"name": "bad", "task": "rbt.record", "schedule": {BAD_SCHEDULES[case]}}}'
    client.hset(key_prefix + "bad", mapping={"definition": definition, "meta": "{}"})
    client.zadd(key_prefix + ":schedule", {key_prefix + "bad": 0})
    flags = [] if mode == "write" else [mode]

    result = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix, *flags)

    assert result.exit_code == 0, result.output
    assert result.exception is None
    refused = [line for line in result.stdout.splitlines() if line.startswith("!")]
    assert len(refused) == 1 and refused[0].startswith(f"! redbeat {key_prefix}bad: "), refused
    assert "1 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
    assert repeat.names("celery") == ([] if flags else ["good"])


def test_a_run_count_past_what_the_counter_goes_on_from_is_refused(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str]
) -> None:
    # Session 39's input probe: a redbeat total_run_count of 10**30 was imported as it was,
    # and the next fire's increment failed on it and started the count again at 1.
    client, key_prefix = old
    store(old, "good", schedule(timedelta(minutes=1)), datetime.now(timezone.utc))
    store(old, "huge", schedule(timedelta(minutes=1)), datetime.now(timezone.utc))
    meta = json.loads(client.hget(key_prefix + "huge", "meta") or b"{}")
    meta["total_run_count"] = 10**30
    client.hset(key_prefix + "huge", "meta", json.dumps(meta))
    result = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    [refused] = [line for line in result.stdout.splitlines() if line.startswith("!")]
    assert "huge" in refused and "run count" in refused, result.stdout
    assert [r.name for r in repeat.list("celery")] == ["good"]
    registration = repeat.get("celery", "good")
    assert registration is not None and registration.fired == 3
