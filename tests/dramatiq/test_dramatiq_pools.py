"""Worker pools of one app: processes that import different actor modules, one source.

`dramatiq app.reports` beside `dramatiq app.billing` share the middleware's source. Each
pool's boot prunes only the schedules of actors its broker knows, so neither deletes the
other's; a decorator removed from an actor a pool still has is pruned as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import RecurringMiddleware, recurring


@pytest.fixture
def brokers(redis_url: str) -> Iterator[list[RedisBroker]]:
    made: list[RedisBroker] = []
    yield made
    for broker in made:
        broker.close()


def pool(
    brokers: list[RedisBroker], redis_url: str, prefix: str, queue: str, actors: dict[str, bool]
) -> RecurringMiddleware:
    """Boot one pool's process: its broker knows `actors` (name -> declared recurring)."""
    broker = RedisBroker(url=redis_url, namespace=f"d{uuid.uuid4().hex[:8]}")
    brokers.append(broker)
    middleware = RecurringMiddleware(prefix=prefix, run_pump=False)
    broker.add_middleware(middleware)
    for name, scheduled in actors.items():
        actor = dramatiq.actor(lambda: None, broker=broker, actor_name=name, queue_name=queue)
        if scheduled:
            recurring(every="1h", name=name)(actor)
    middleware.boot(broker)
    return middleware


def test_two_pools_of_one_source_keep_each_others_schedules(
    brokers: list[RedisBroker], redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    repeat = Repeat(client, prefix)
    pool(brokers, redis_url, prefix, queue, {"reports_job": True})
    pool(brokers, redis_url, prefix, queue, {"billing_job": True})
    pool(brokers, redis_url, prefix, queue, {"reports_job": True})  # a restart of the first
    assert sorted(repeat.names(queue)) == ["billing_job", "reports_job"]
    # The reports pool drops the decorator (the actor stays): its boot prunes that one only.
    pool(brokers, redis_url, prefix, queue, {"reports_job": False})
    assert repeat.names(queue) == ["billing_job"]
