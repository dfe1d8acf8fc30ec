"""The registry client RecurringMiddleware makes has socket timeouts (found by a probe of a
registry behind a black-holed link, session 34): on redis-py before 8, which has none by
default (the floor is 6.4), a partition held the worker's pump thread, its reports and a
guarded actor's start check for as long as TCP kept retrying (over two minutes), with
nothing logged. A URL, or the RedisBroker's connection settings, now get 5 s for both
(`REGISTRY_TIMEOUTS`), as redis-py 8's defaults; timeouts the URL or the broker's client set
are kept, and a client the user gives is used as given. Real server (the clients connect)."""

from __future__ import annotations

from typing import Any

import redis
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware
from emq_bridge.dramatiq.middleware import REGISTRY_TIMEOUTS


def timeouts(client: Any) -> tuple[Any, Any]:
    kwargs = client.connection_pool.connection_kwargs
    return kwargs.get("socket_connect_timeout"), kwargs.get("socket_timeout")


def test_the_brokers_client_without_timeouts_is_given_them(redis_url: str) -> None:
    bare = redis.Redis.from_url(redis_url, socket_timeout=None, socket_connect_timeout=None)
    broker = RedisBroker(client=bare)
    repeat = RecurringMiddleware().registry(broker)
    assert timeouts(repeat.client) == (5.0, 5.0) == tuple(REGISTRY_TIMEOUTS.values())
    assert timeouts(bare) == (None, None)  # the broker's own client is left as it was
    assert repeat.server_time_ms() > 0  # the same server


def test_timeouts_the_broker_or_the_url_set_are_kept(redis_url: str) -> None:
    own = redis.Redis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=1.0)
    assert RecurringMiddleware().registry(RedisBroker(client=own)).client is own
    from_url = RecurringMiddleware(repeat=redis_url).registry(None)
    assert timeouts(from_url.client) == (5.0, 5.0)
    chosen = RecurringMiddleware(repeat=f"{redis_url}?socket_timeout=30").registry(None)
    assert timeouts(chosen.client) == (5.0, 30.0)
    given = redis.Redis.from_url(redis_url, socket_timeout=None)
    assert RecurringMiddleware(repeat=given).registry(None).client is given
