"""The brokers of the bench: a real Celery app on Redis and a real Dramatiq `RedisBroker`.

Both live on the bench's embedded server, in their own databases. Nothing consumes the
queues: the bench counts what the brokers accepted by reading the queues themselves.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from .common import DB_CELERY, DB_DRAMATIQ, QUEUE, TASK

log = logging.getLogger("bench.brokers")


def db_url(url: str, db: int) -> str:
    """Return `url` pointing at database `db`."""
    base = url.rsplit("/", 1)[0]
    return f"{base}/{db}"


# -- Celery -----------------------------------------------------------------------------


def celery_app(url: str, **conf: Any) -> Any:
    """Return a Celery app whose broker is database DB_CELERY of the bench server."""
    from celery import Celery

    app = Celery("bench", broker=db_url(url, DB_CELERY), set_as_current=True)
    app.conf.update(
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        result_backend=None,
        enable_utc=True,
        timezone="UTC",
        beat_enable_remote_control=False,
        **conf,
    )

    app.task(name=TASK)(bench_noop)
    return app


def bench_noop(*args: Any, **kwargs: Any) -> None:
    """Do nothing: the bench never runs a worker, it only counts messages."""


def celery_queue_length(client: redis.Redis) -> int:
    """Return how many messages the Celery broker holds on the bench queue."""
    return int(client.llen(QUEUE))


def celery_message_ids(client: redis.Redis) -> list[str]:
    """Return the task id of every message on the Celery bench queue."""
    raw = client.lrange(QUEUE, 0, -1)
    return [json.loads(m)["headers"]["id"] for m in raw]


def celery_clear(client: redis.Redis) -> None:
    client.delete(QUEUE)


# -- Dramatiq ---------------------------------------------------------------------------


def dramatiq_broker(url: str) -> Any:
    """Return a Dramatiq RedisBroker on database DB_DRAMATIQ with the bench actor declared."""
    import dramatiq
    from dramatiq.brokers import redis as dramatiq_redis

    broker_class: Any = dramatiq_redis.RedisBroker
    broker = broker_class(url=db_url(url, DB_DRAMATIQ))
    dramatiq.set_broker(broker)

    declare: Any = dramatiq.actor
    declare(bench_noop, actor_name=TASK, queue_name=QUEUE, broker=broker)
    return broker


def dramatiq_queue_length(client: redis.Redis) -> int:
    """Return how many messages the Dramatiq broker holds on the bench queue."""
    return int(client.llen(f"dramatiq:{QUEUE}"))


def dramatiq_message_ids(client: redis.Redis) -> list[str]:
    """Return the Dramatiq message_id of every message on the bench queue."""
    return [json.loads(m)["message_id"] for m in client.hvals(f"dramatiq:{QUEUE}.msgs")]


def dramatiq_clear(client: redis.Redis) -> None:
    client.delete(f"dramatiq:{QUEUE}", f"dramatiq:{QUEUE}.msgs")


# -- emq-bridge dispatchers -------------------------------------------------------------


def adapters_available() -> dict[str, bool]:
    """Say which emq-bridge adapters import on this checkout."""
    found = {}
    for module in ("emq_bridge.celery", "emq_bridge.dramatiq"):
        try:
            __import__(module)
            found[module] = True
        except ImportError:
            found[module] = False
    return found


def emq_dispatcher(path: str, url: str) -> tuple[Any, str]:
    """Return `(dispatcher, description)` for a path of emq-bridge.

    `celery`: `CeleryDispatcher(app)` (every message through `apply_async`);
    `celery-pipelined`: the opt-in `PipelinedCeleryDispatcher(app)`; `dramatiq`:
    `DramatiqDispatcher(broker)` (every message through `broker.enqueue`; the middleware's
    `pipelined=False`); `dramatiq-pipelined`: `PipelinedDramatiqDispatcher(broker)` (a
    claimed batch in one round trip); `dramatiq-auto`: `dramatiq_dispatcher(broker)`, the
    choice `RecurringMiddleware` makes by default (pipelined on a plain RedisBroker).
    """
    if path == "celery":
        from emq_bridge.celery import CeleryDispatcher

        return CeleryDispatcher(celery_app(url)), "CeleryDispatcher(app)"
    if path == "celery-pipelined":
        from emq_bridge.celery import PipelinedCeleryDispatcher

        return PipelinedCeleryDispatcher(celery_app(url)), "PipelinedCeleryDispatcher(app)"
    from emq_bridge.dramatiq import (
        DramatiqDispatcher,
        PipelinedDramatiqDispatcher,
        dramatiq_dispatcher,
    )

    broker = dramatiq_broker(url)
    if path == "dramatiq-pipelined":
        return PipelinedDramatiqDispatcher(broker), "PipelinedDramatiqDispatcher(broker)"
    if path == "dramatiq-auto":
        return dramatiq_dispatcher(broker), "dramatiq_dispatcher(broker)"
    return DramatiqDispatcher(broker), "DramatiqDispatcher(broker)"
