"""Run in its own process by test_sentry_beat_monitors.py (sentry-sdk patches Celery
process-wide): prints, as JSON, what `emq_bridge.celery.sentry` does in each case."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta
from typing import Any

import crons_capture
import sentry_sdk
from celery import Celery
from celery.schedules import crontab, schedule, solar
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.integrations.celery.beat import _get_monitor_config

from emq_bridge.celery import CeleryDispatcher, RepeatScheduler
from emq_bridge.celery.sentry import beat_monitors, monitor_config
from emq_bridge.occurrence import Occurrence, occurrence_id

monitor_beat_tasks = sys.argv[1] == "on"
crons_capture.init([CeleryIntegration(monitor_beat_tasks=monitor_beat_tasks)])
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
PREFIX, QUEUE = os.environ["SENTRY_PREFIX"], os.environ["SENTRY_QUEUE"]

app = Celery("check", broker=os.environ["SENTRY_BROKER"], set_as_current=False)
app.conf.update(
    timezone="America/New_York",
    task_default_queue=QUEUE,
    emq_bridge_prefix=PREFIX,
    emq_bridge_pipelined=True,
    result_backend=None,
    result_expires=None,
    beat_schedule={
        "nightly report": {"task": "t.ok", "schedule": crontab(minute=0, hour=2)},
        "hourly": {"task": "t.ok", "schedule": timedelta(hours=1)},
    },
)


@app.task(name="t.ok", shared=False)  # type: ignore[untyped-decorator]
def ok() -> None:
    return None


SCHEDULES: dict[str, Any] = {
    "crontab": crontab(minute="*/5", hour="9-17", day_of_week="1-5", app=app),
    "crontab-ints": crontab(minute=0, hour=[1, 13]),
    "interval-90s": schedule(timedelta(seconds=90)),
    "interval-3d": schedule(timedelta(days=3)),
    "interval-30s": schedule(timedelta(seconds=30)),
    "solar": solar("sunrise", 48.85, 2.35, app=app),
}
out: dict[str, Any] = {
    "configs": {
        key: [monitor_config(value, app, key), _get_monitor_config(value, app, key)]
        for key, value in SCHEDULES.items()
    }
}
monitors = beat_monitors(app)
assert monitors is not None
out["entries"] = sorted([*key, slug] for key, (slug, _) in monitors.entries.items())


def occurrence(name: str, **flags: Any) -> Occurrence:
    ident = occurrence_id(PREFIX, QUEUE, name, 60_000, triggered=flags.get("triggered", False))
    return Occurrence(QUEUE, name, 60_000, ident, {"task": "t.ok"}, 60_000, **flags)


traces = [sentry_sdk.get_traceparent()]


def sent(found: Any) -> Any:
    """Keep the trace the beat's scope holds after one send: each should start its own."""
    traces.append(sentry_sdk.get_traceparent())
    return found


out["scheduled"] = sent(monitors.headers(occurrence("nightly_report")))
out["redelivered"] = sent(monitors.headers(occurrence("nightly_report", redelivered=True)))
out["triggered"] = sent(monitors.headers(occurrence("nightly_report", triggered=True)))
out["unknown"] = sent(monitors.headers(occurrence("added-at-runtime")))
out["traces"] = len({str(t).split("-")[0] for t in traces})
out["occurrence_id"] = occurrence("nightly_report").id
# A sentry-sdk without an API the check-in uses (before 2.12: no get_isolation_scope): the
# occurrence goes without its check-in, it is not held back.
kept = sentry_sdk.get_isolation_scope
del sentry_sdk.get_isolation_scope
out["broken"] = [monitors.headers(occurrence("nightly_report")) for _ in range(2)]
sentry_sdk.get_isolation_scope = kept
scheduler = RepeatScheduler(app)
assert scheduler.pump is not None
out["dispatcher"] = type(scheduler.pump.dispatcher).__name__
out["hooked"] = isinstance(scheduler.pump.dispatcher, CeleryDispatcher) and (
    scheduler.pump.dispatcher.extra_headers is not None
)
scheduler.close()
print(json.dumps(out))
