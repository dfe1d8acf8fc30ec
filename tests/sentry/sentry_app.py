"""The Celery app both beats (Celery's own and `-S emq`) and the worker of the Sentry Crons
test run: sentry-sdk with `CeleryIntegration(monitor_beat_tasks=True)` and a transport that
appends every envelope item sentry-sdk sends to `$SENTRY_ENVELOPES` (`crons_capture`).

The tasks write the Sentry headers they received to `$TASK_HEADERS` (the worker's), so the
test compares what the messages carried as well as the check-ins.

Sentry Crons monitors intervals of whole minutes only, so the entries that fire beat after
beat during the test are `QuickMinute`s: a one-minute interval to Sentry (the monitor config
both beats build from the schedule object), due every `BEAT_S` seconds to both beats.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import crons_capture
from celery import Celery
from celery.schedules import crontab, schedstate, schedule
from sentry_sdk.integrations.celery import CeleryIntegration

import emq_bridge.celery  # noqa: F401  # the worker's reports, as an app using emq-bridge has

crons_capture.init([CeleryIntegration(monitor_beat_tasks=True, exclude_beat_tasks=["excluded-.*"])])

QUEUE = os.environ["SENTRY_QUEUE"]
BEAT_S = 2.5
# From the test: an hour of the day far from now, and emq-bridge's grid offsets whose next
# slot is far from now. The entries fire once at start; a slot of theirs within a second of
# that start would be a second beat too soon.
QUIET_HOUR = os.environ["SENTRY_QUIET_HOUR"]
OFFSETS = {
    "hourly-interval": os.environ["SENTRY_QUIET_OFFSET_2H"],
    "every-two-minutes": os.environ["SENTRY_QUIET_OFFSET_2M"],
}


class QuickMinute(schedule):  # type: ignore[misc]  # celery is untyped
    """One minute as Sentry Crons reads it (`run_every`, so `seconds`), due every `BEAT_S`
    seconds as both beats read it (`is_due`, the only method Celery's beat calls; to
    emq-bridge, a custom schedule checked as Celery's beat checks it)."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        elapsed = (self.now() - self.maybe_make_aware(last_run_at)).total_seconds()
        if elapsed >= BEAT_S:
            return schedstate(True, BEAT_S)
        return schedstate(False, BEAT_S - elapsed)


app = Celery("sentry_app", broker=os.environ["SENTRY_BROKER"])
app.conf.update(
    timezone="Europe/Paris",
    task_default_queue=QUEUE,
    emq_bridge_prefix=os.environ["SENTRY_PREFIX"],
    result_backend=None,
    result_expires=None,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        # A name with spaces: the monitor slug is the entry's name, the registration's
        # name has them replaced.
        "digest every quarter": {
            "task": "sentry_app.ok",
            "schedule": crontab(minute="*/15", hour=QUIET_HOUR),
        },
        "weekday paris": {
            "task": "sentry_app.ok",
            "schedule": crontab(minute="30", hour="9", day_of_week="mon-fri"),
        },
        "hourly-interval": {
            "task": "sentry_app.fail",
            "schedule": timedelta(hours=2),
            "offset": OFFSETS["hourly-interval"],
        },
        "every-two-minutes": {
            "task": "sentry_app.ok",
            "schedule": 120.0,
            "offset": OFFSETS["every-two-minutes"],
        },
        # Beat after beat during the test: one succeeds, one fails.
        "quick-ok": {"task": "sentry_app.ok", "schedule": QuickMinute(60)},
        "quick-fail": {"task": "sentry_app.fail", "schedule": QuickMinute(60)},
        # Not monitored by Sentry Crons: under a minute (beat after beat), excluded by name.
        "fast": {"task": "sentry_app.plain", "schedule": BEAT_S},
        "excluded-nightly": {"task": "sentry_app.ok", "schedule": crontab(minute="0", hour="3")},
    },
)


if os.environ.get("SENTRY_SIDE") == "celery":
    # Celery's beat: every entry last ran days ago, so each is due at start (one beat).
    for entry in app.conf.beat_schedule.values():
        entry["last_run_at"] = datetime.now(timezone.utc) - timedelta(days=3)
        entry.pop("offset", None)  # emq-bridge's key; Celery's intervals count from the last run


def seed() -> None:
    """emq-bridge's side of the same start: the registrations the beat syncs, created as if
    three days ago (same definitions and owner, so the beat's sync finds them unchanged), so
    each is due when the beat starts."""
    from emq_bridge.celery import app_schedule, repeat_for

    plan = app_schedule(app)
    with repeat_for(app) as repeat:
        items = [(d.queue, d.name, d.definition) for d in plan.declarations]
        past_ms = repeat.server_time_ms() - 3 * 86_400_000
        assert set(repeat.upsert_many(items, source=plan.source, now_ms=past_ms)) == {"created"}


def _record(request: Any) -> None:
    headers = dict(request.headers or {})
    headers.update(headers.pop("headers", None) or {})
    found = {k: v for k, v in headers.items() if k.startswith("sentry-monitor")}
    found["emq_schedule"] = headers.get("emq_schedule", getattr(request, "emq_schedule", None))
    found["trace"] = headers.get("sentry-trace")  # the trace the task continues
    found["task"] = request.task
    found["id"] = request.id
    with open(os.environ["TASK_HEADERS"], "a", encoding="utf-8") as out:
        out.write(json.dumps(found, default=str) + "\n")


@app.task(bind=True, name="sentry_app.ok")  # type: ignore[untyped-decorator]
def ok(self: Any) -> None:
    _record(self.request)


@app.task(bind=True, name="sentry_app.plain")  # type: ignore[untyped-decorator]
def plain(self: Any) -> None:
    _record(self.request)


@app.task(bind=True, name="sentry_app.fail")  # type: ignore[untyped-decorator]
def fail(self: Any) -> None:
    _record(self.request)
    raise RuntimeError("this beat task fails")
