"""A celery-redbeat crontab carries no zone: redbeat fires it in its app's `timezone`, which
only the user knows. An import that reads crontabs in UTC because `--timezone` was not given
says so on a `note:` line (stderr), so that a Kolkata 10:08 job is not silently moved by 5½
hours; given a zone (UTC too), or with no crontab, there is no such note."""

from __future__ import annotations

import json
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry

NOTE = (
    "note: 1 crontab schedule(s) read in UTC, the --timezone default; celery-redbeat fires "
    "them in its app's timezone setting: if that is not UTC, import again with --timezone ZONE"
)


def _import(redis_url: str, app: Celery) -> tuple[str, ...]:
    """`emq-bridge import redbeat` of `app`'s entries on the test server."""
    return ("import", "redbeat", "--from", redis_url, "--prefix", app.redbeat_conf.key_prefix)


def _notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "crontab" in line and line.startswith("note:")]


def test_crontabs_read_in_utc_by_default_are_named_on_a_note(
    run: Run, redis_url: str, redbeat_app: Celery
) -> None:
    RedBeatSchedulerEntry("ist", "app.t", crontab(minute=8, hour=10), app=redbeat_app).save()
    every = schedule(timedelta(minutes=5))
    RedBeatSchedulerEntry("plain", "app.t", every, app=redbeat_app).save()
    args = _import(redis_url, redbeat_app)

    dry = run(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert _notes(dry.stderr) == [NOTE]
    assert "cron 8 10 * * * (UTC)" in dry.stdout

    given = run(*args, "--timezone", "Asia/Kolkata", "--dry-run")
    assert given.exit_code == 0, given.output
    assert _notes(given.stderr) == []
    assert "cron 8 10 * * * (Asia/Kolkata)" in given.stdout

    utc = run(*args, "--timezone", "UTC", "--json")
    assert utc.exit_code == 0, utc.output
    assert _notes(utc.stderr) == []

    # Imported in UTC, then again with the app's zone: the registration follows the zone.
    again = run(*args, "--timezone", "Asia/Kolkata", "--json")
    assert again.exit_code == 0, again.output
    updated = json.loads(again.stdout)["updated"]
    assert [(u["name"], u["cadence"]) for u in updated] == [
        ("ist", "cron 8 10 * * * (Asia/Kolkata)")
    ]


def test_no_note_without_a_crontab(run: Run, redis_url: str, redbeat_app: Celery) -> None:
    every = schedule(timedelta(minutes=5))
    RedBeatSchedulerEntry("plain", "app.t", every, app=redbeat_app).save()
    args = _import(redis_url, redbeat_app)
    done = run(*args)
    assert done.exit_code == 0, done.output
    assert _notes(done.stderr) == []
