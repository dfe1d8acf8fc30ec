"""The app: an ordinary `beat_schedule`, switched to emq-bridge by one setting."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

app = Celery("celery_app", include=["celery_app.tasks"])
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    timezone="Europe/Paris",
    # The one line that replaces Celery's beat (or run `celery beat -S emq`):
    beat_scheduler="emq_bridge.celery:RepeatScheduler",
    # Optional: where the registry lives (default: the broker, when it is Redis).
    emq_bridge_redis_url=os.environ.get("EMQ_BRIDGE_REDIS_URL"),
    emq_bridge_prefix=os.environ.get("EMQ_BRIDGE_PREFIX", "example"),
    beat_schedule={
        "heartbeat": {"task": "celery_app.tasks.heartbeat", "schedule": 10.0},
        "tidy-up": {
            "task": "celery_app.tasks.tidy",
            "schedule": timedelta(minutes=5),
            "kwargs": {"older_than_days": 30},
            "options": {"expires": 60},
        },
        "weekday-report": {
            "task": "celery_app.tasks.report",
            # 07:30 Paris time, Monday to Friday, in the app's time zone.
            "schedule": crontab(minute=30, hour=7, day_of_week="mon-fri"),
            "args": ["sales"],
        },
    },
)
