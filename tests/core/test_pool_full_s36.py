"""A client whose connection pool is full is said so, not "Redis is unreachable" (found by a
probe of client variants, session 36: with `max_connections=1` a pump's wake-up
subscription holds the only connection, every move failed, and the pump logged "Redis is
unreachable; retrying" for ever, with Redis up). Both of redis-py's pools. A real server."""

from __future__ import annotations

import pytest
import redis

from emq_bridge import RegistryUnavailable, Repeat


@pytest.mark.parametrize("kind", [redis.ConnectionPool, redis.BlockingConnectionPool])
def test_a_full_pool_is_named_with_what_holds_connections(
    client: redis.Redis, prefix: str, kind: type[redis.ConnectionPool]
) -> None:
    options = dict(client.connection_pool.connection_kwargs)
    extra = {"timeout": 0.1} if kind is redis.BlockingConnectionPool else {}
    pool = kind(max_connections=1, **options, **extra)
    repeat = Repeat(redis.Redis(connection_pool=pool), prefix)
    wakeups = repeat.subscribe(["q"])  # what a pump holds between its ticks
    try:
        with pytest.raises(RegistryUnavailable) as raised:
            repeat.server_time_ms()
        message = str(raised.value)
        assert "the client's connection pool has no free connection" in message, message
        assert "unreachable" not in message and "max_connections" in message
    finally:
        wakeups.close()
        pool.disconnect()
