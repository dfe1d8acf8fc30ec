"""A small Dramatiq app whose actors run on recurring schedules kept in Redis.

Run it from the repository root with the `dramatiq` command, against `$REDIS_URL`
(default `redis://127.0.0.1:6379/0`, Dramatiq's own default)::

    REDIS_URL=redis://localhost:6379/0 dramatiq examples.dramatiq_app

or on an embedded server started for the run (no Redis needed)::

    python -m examples.dramatiq_app

Each worker process syncs the schedules below into the registry when it boots and runs
a pump thread, so no separate scheduler process is needed. `EMQ_PREFIX` (default `emq`)
and `DRAMATIQ_NAMESPACE` (default `dramatiq`) set the key prefixes.
"""

from __future__ import annotations

import logging
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, current_occurrence, every, recurring

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

broker = RedisBroker(url=REDIS_URL, namespace=os.environ.get("DRAMATIQ_NAMESPACE", "dramatiq"))
# The registry lives on the broker's Redis; `source` names what this app's sync owns.
broker.add_middleware(
    RecurringMiddleware(prefix=os.environ.get("EMQ_PREFIX", "emq"), source="examples.dramatiq_app")
)
dramatiq.set_broker(broker)

log = logging.getLogger(__name__)


def _slot() -> str:
    """Describe the occurrence being served: its registration and nominal time (UTC)."""
    occurrence = current_occurrence()
    if occurrence is None:
        return "sent by hand"
    return f"{occurrence.name} due {occurrence.due:%H:%M:%S} UTC (id {occurrence.id[:8]})"


@recurring(every="2s")
@dramatiq.actor(queue_name="heartbeats")
def heartbeat() -> None:
    """Show that the app is alive, every two seconds."""
    log.info("heartbeat: %s", _slot())


@recurring(every="15m")
@dramatiq.actor(queue_name="reports")
def refresh_reports() -> None:
    """Rebuild the reports every 15 minutes, on :00/:15/:30/:45 of the first boot's phase."""
    log.info("refresh_reports: %s", _slot())


@recurring(cron="0 9 * * 1-5", tz="Europe/Paris", name="morning-digest", args=["team"])
@recurring(cron="0 18 * * 5", tz="Europe/Paris", name="weekly-digest", args=["everyone"])
@dramatiq.actor(queue_name="reports")
def send_digest(audience: str) -> None:
    """Mail a digest: two schedules on one actor, named distinctly, with different args."""
    log.info("send_digest(%r): %s", audience, _slot())


@dramatiq.actor(queue_name="maintenance", recurring=every("1h", kwargs={"older_than_days": 7}))
def purge_tmp(older_than_days: int) -> None:
    """Purge old temporary files, hourly: the actor-option form of a schedule."""
    log.info("purge_tmp(older_than_days=%d): %s", older_than_days, _slot())
