"""Tasks: some scheduled by `beat_schedule`, some by the `@recurring` decorator."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from emq_bridge.celery import nominal_time, recurring

from .app import app

log = logging.getLogger(__name__)


@app.task(bind=True)
def heartbeat(self: Task) -> str:
    """Log which slot this run serves: the nominal time travels in a header."""
    slot = nominal_time(self.request)
    log.info("heartbeat %s for the slot of %s", self.request.id, slot)
    return str(slot)


@app.task
def tidy(older_than_days: int) -> int:
    log.info("tidying records older than %d days", older_than_days)
    return older_than_days


@app.task
def report(kind: str) -> str:
    log.info("sending the %s report", kind)
    return kind


@recurring(cron="0 9 * * *", tz="Europe/Paris")
@app.task
def morning_digest() -> None:
    """Every day at 09:00 Paris time, synced into the registry when a worker or beat starts."""
    log.info("morning digest")


@recurring(every="30s", kwargs={"source": "decorator"})
@app.task
def poll(**kwargs: Any) -> dict[str, Any]:
    """Every 30 seconds, drift-free."""
    log.info("poll %s", kwargs)
    return kwargs
