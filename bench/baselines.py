"""Baselines: what the brokers and the server do with no scheduler in front of them.

* a plain `app.send_task` loop (Celery on Redis),
* a plain `broker.enqueue` loop (Dramatiq's RedisBroker),
* pipelined LPUSH of a Celery-sized message, 1,000 per round trip (the server's ceiling),
* emq-bridge's pump with a dispatcher that sends nothing (the pump's own ceiling).
"""

from __future__ import annotations

from typing import Any

import redis

from .brokers import celery_app, db_url, dramatiq_broker
from .common import ARGS, DB_CELERY, KWARGS, QUEUE, TASK, Server, measured, now_ms
from .scenarios import broker_view
from .systems import Emq


def _figures(run: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "rate": n / run["seconds"],
        "round_trips_per_occ": run["round_trips"] / n,
        "commands_sent_per_occ": run["commands_sent"] / n,
        "server_commands_per_occ": run["server_commands"] / n,
    }


def send_task_loop(server: Server, n: int) -> dict[str, Any]:
    app = celery_app(server.url)
    view = broker_view(server.url, "celery")
    app.send_task(TASK, args=ARGS, kwargs=KWARGS, queue=QUEUE)  # connect, declare
    view.clear()
    with measured(server) as run:
        for _ in range(n):
            app.send_task(TASK, args=ARGS, kwargs=KWARGS, queue=QUEUE)
    assert view.length() == n, "the send_task loop lost messages"
    return _figures(run, n)


def enqueue_loop(server: Server, n: int) -> dict[str, Any]:
    broker = dramatiq_broker(server.url)
    actor = broker.get_actor(TASK)
    view = broker_view(server.url, "dramatiq")
    broker.enqueue(actor.message(*ARGS, **KWARGS))  # connect, load the script
    view.clear()
    with measured(server) as run:
        for _ in range(n):
            broker.enqueue(actor.message(*ARGS, **KWARGS))
    assert view.length() == n, "the enqueue loop lost messages"
    return _figures(run, n)


def pipelined_lpush(server: Server, n: int, per_round_trip: int = 1000) -> dict[str, Any]:
    client = redis.Redis.from_url(db_url(server.url, DB_CELERY))
    app = celery_app(server.url)
    app.send_task(TASK, args=ARGS, kwargs=KWARGS, queue=QUEUE)
    payload: Any = client.lpop(QUEUE) or b"x" * 800  # one real Celery message, as the payload
    view = broker_view(server.url, "celery")
    view.clear()
    with measured(server) as run:
        pipe = client.pipeline(transaction=False)
        for i in range(n):
            pipe.lpush(QUEUE, payload)
            if i % per_round_trip == per_round_trip - 1:
                pipe.execute()
        pipe.execute()
    assert view.length() == n, "the pipelined loop lost messages"
    view.clear()
    return _figures(run, n)


class _Counting:
    """Accept every occurrence without sending it: the pump's own ceiling."""

    def __init__(self) -> None:
        self.count = 0

    def dispatch(self, occurrence: Any) -> None:
        self.count += 1


def pump_ceiling(server: Server, emq: Emq, n: int) -> dict[str, Any]:
    """Drain a burst of n through emq-bridge's pump with a dispatcher that sends nothing."""
    from emq_bridge import Pump

    counting = _Counting()
    pump = Pump(emq.repeat, [QUEUE], counting)
    emq.make_due(n, now_ms() - 1000)
    with measured(server) as run:
        pump.run_once()
    assert counting.count == n, f"the pump fired {counting.count} of {n}"
    return _figures(run, n)
