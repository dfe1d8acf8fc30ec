"""The Dramatiq app of the Sentry Crons test: a worker with `RecurringMiddleware` (its pump
thread sends the occurrences) and `SentryCrons` (its check-ins), sentry-sdk capturing to a
file (`crons_capture`).
"""

from __future__ import annotations

import os

import crons_capture
import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring
from emq_bridge.dramatiq.schedule import broker_declarations
from emq_bridge.dramatiq.sentry import SentryCrons

crons_capture.init([])

QUEUE = os.environ["SENTRY_QUEUE"]
broker = RedisBroker(url=os.environ["SENTRY_BROKER"], namespace=f"{QUEUE}-dq")  # type: ignore[no-untyped-call]
middleware = RecurringMiddleware(prefix=os.environ["SENTRY_PREFIX"], max_sleep_s=0.2)
broker.add_middleware(middleware)
broker.add_middleware(SentryCrons())
dramatiq.set_broker(broker)


# Due once at start (seeded): their next slots are far from now (an hour of the day, a grid
# offset, from the test), as a slot passing mid-test would send one check-in pair more.
@recurring(
    cron=f"*/15 {os.environ['SENTRY_QUIET_HOUR']} * * *", tz="Europe/Paris", name="quarterly-digest"
)
@dramatiq.actor(queue_name=QUEUE)
def digest() -> None:
    return None


@recurring(every="2h", offset=os.environ["SENTRY_QUIET_OFFSET"], name="two-hourly-sync")
@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def sync() -> None:
    raise RuntimeError("this scheduled actor fails")


@recurring(every="45s", name="fast")  # under a minute: not a Sentry Crons schedule
@dramatiq.actor(queue_name=QUEUE)
def fast() -> None:
    return None


def seed() -> None:
    """The worker's schedules, created as if three days ago (same definitions and owner, so
    the worker's boot sync finds them unchanged): each is due when the worker starts."""
    repeat = middleware.registry(broker)
    items = [(d.queue, d.name, d.definition) for d in broker_declarations(broker)]
    past_ms = repeat.server_time_ms() - 3 * 86_400_000
    assert set(repeat.upsert_many(items, source=middleware.source, now_ms=past_ms)) == {"created"}
