"""A staged cut-over (`import --paused`, then `--resume`) from django-celery-beat does not
fire the slots that passed between the old scheduler's last run and the resume (it may have
sent them without its store saying so yet: it saves its last runs every few minutes), but it
dropped them silently: `missed 0` and no line, where every other slot not fired is counted
(found by a probe of a Django project's switch from django-celery-beat, session 33: a
one-minute crontab's slot between the old beat's stop and `--resume` never ran, unsaid).
They are counted in `missed` now, with one WARNING naming the schedule. From celery-redbeat,
which stores a run before it sends it, such a slot was never sent: the cut-over fires it at
once (session 36). A redbeat entry read by its reader, applied as each reader's plan is.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery
from celery.schedules import crontab
from cli_run import Run
from redbeat import RedBeatSchedulerEntry

from emq_bridge import Repeat
from emq_bridge.celery.importers.redbeat import importer_app, read_redbeat
from emq_bridge.migrate.plan import ImportPlan, apply_import


def import_args(redis_url: str, app: Celery) -> tuple[str, ...]:
    return ("import", "redbeat", "--from", redis_url, "--prefix", app.redbeat_conf.key_prefix)


def passed_minute(redbeat_app: Celery) -> datetime:
    """Every minute, last run at the start of the minute two minutes ago: the slot a minute
    ago came after it (the old beat stopped), the next one is ahead."""
    now = datetime.now(timezone.utc)
    last_run = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    RedBeatSchedulerEntry(
        "digest", "rbt.digest", crontab(), app=redbeat_app, last_run_at=last_run
    ).save()
    return now


def test_the_slots_a_cut_over_does_not_fire_are_counted_and_said(
    repeat: Repeat, redis_url: str, redbeat_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    now = passed_minute(redbeat_app)

    def plan() -> ImportPlan:  # as django-celery-beat's reader makes it: no run stored first
        read = read_redbeat(
            redis.Redis.from_url(redis_url),
            app=importer_app(),
            now_ms=repeat.server_time_ms(),
            key_prefix=redbeat_app.redbeat_conf.key_prefix,
        )
        return replace(read, records_before_send=False)

    apply_import(repeat, plan(), paused=True)
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        cut = apply_import(repeat, plan(), resume=True)
    assert [e.declaration.name for e in cut.resumed] == ["digest"]

    digest = repeat.get("celery", "digest")
    assert digest is not None and not digest.paused and digest.next_run_ms is not None
    assert digest.next_run_ms > now.timestamp() * 1000  # the passed slot is not fired
    assert digest.missed >= 1  # but counted (two if the minute turned since `now`)
    line = next(x for x in caplog.messages if "not fired at the cut-over" in x)
    assert "celery/digest" in line and "counted in missed" in line


def test_a_cut_over_from_redbeat_fires_the_slot_it_never_sent(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    passed_minute(redbeat_app)
    args = import_args(redis_url, redbeat_app)
    assert run(*args, "--paused").exit_code == 0
    cut = run(*args, "--resume")
    assert cut.exit_code == 0 and "1 resumed" in cut.stderr, cut.output
    assert "not fired at the cut-over" not in cut.stderr
    digest = repeat.get("celery", "digest")
    assert digest is not None and not digest.paused and digest.next_run_ms is not None
    assert digest.next_run_ms <= repeat.server_time_ms()  # due: fired at once


def test_an_entry_disabled_after_its_import_is_said_active_here_on_the_next_import(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    # The same probe: a periodic task disabled in the admin after the switch kept running,
    # and the import run again said only `= ... unchanged`. An import leaves pauses to the
    # operator (migration.md), so it says which to pause, with the command.
    entry = RedBeatSchedulerEntry("expiring", "rbt.expiring", crontab(minute="0"), app=redbeat_app)
    entry.save()
    args = import_args(redis_url, redbeat_app)
    assert run(*args).exit_code == 0
    entry.enabled = False
    entry.save()
    again = run(*args)
    assert again.exit_code == 0, again.output
    [line] = [x for x in again.output.splitlines() if "celery/expiring" in x]
    assert line.startswith("= ") and "disabled in the old scheduler but active here" in line
    assert "is): emq-bridge pause celery expiring  <- redbeat" in line
    expiring = repeat.get("celery", "expiring")
    assert expiring is not None and not expiring.paused  # left as it is
