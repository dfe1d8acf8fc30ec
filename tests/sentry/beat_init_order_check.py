"""Run in its own process by test_sentry_beat_init_s29.py (sentry-sdk patches Celery
process-wide): a pipelined beat whose app starts sentry-sdk in `beat_init`, as docs/sentry.md
shows, driven in Celery's order (the scheduler is built, then `beat_init` is sent, then the
ticks). Prints, as JSON, the dispatcher before and after the first tick and the headers of
the task that tick sent."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import crons_capture
import redis
from celery import Celery, beat, signals
from celery.schedules import crontab
from sentry_sdk.integrations.celery import CeleryIntegration

from emq_bridge.celery import RepeatScheduler

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
PREFIX, QUEUE, BROKER = (
    os.environ["SENTRY_PREFIX"],
    os.environ["SENTRY_QUEUE"],
    os.environ["SENTRY_BROKER"],
)

app = Celery("order", broker=BROKER, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    emq_bridge_prefix=PREFIX,
    emq_bridge_pipelined=True,
    result_backend=None,
    result_expires=None,
    beat_schedule={"minutely": {"task": "t.ok", "schedule": crontab()}},
)


@app.task(name="t.ok", shared=False)  # type: ignore[untyped-decorator]
def ok() -> None:
    return None


@signals.beat_init.connect
def start_sentry(**_: Any) -> None:  # the docs' setup: Sentry starts with the beat
    crons_capture.init([CeleryIntegration(monitor_beat_tasks=True)])


service = beat.Service(app, scheduler_cls=RepeatScheduler)
scheduler = service.scheduler  # built before beat_init is sent, as Service.start does
assert isinstance(scheduler, RepeatScheduler) and scheduler.pump is not None
before = type(scheduler.pump.dispatcher).__name__
signals.beat_init.send(sender=service)
# The registration's slot of the minute that began is due now (the test's one hand on the
# registry's state: a minutely cron would otherwise wait for the next minute).
client = redis.Redis.from_url(BROKER)
minute_ms = int(time.time() * 1000) // 60_000 * 60_000
client.zadd(f"{PREFIX}:{{{QUEUE}}}:repeat", {"minutely": minute_ms}, xx=True)
scheduler.tick()
after = type(scheduler.pump.dispatcher).__name__
sent = [json.loads(raw) for raw in client.lrange(QUEUE, 0, -1)]
scheduler.close()
print(json.dumps({"before": before, "after": after, "headers": [m["headers"] for m in sent]}))
