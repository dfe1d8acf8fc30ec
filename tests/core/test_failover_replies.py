"""A server in the middle of a failover answers errors that are an outage, not a broken
registry: the pump retries them with backoff and tells the outage once (not one ERROR a
queue), and the CLI exits 3. Real replies of a real server, parsed by redis-py."""

from __future__ import annotations

import pytest
import redis

from emq_bridge.errors import RegistryError, RegistryUnavailable
from emq_bridge.replies import redis_errors


@pytest.mark.parametrize(
    "reply",
    [
        "CLUSTERDOWN The cluster is down",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "READONLY You can't write against a read only replica.",
    ],
)
def test_a_failover_reply_is_an_outage(client: redis.Redis, reply: str) -> None:
    script = "return redis.error_reply(ARGV[1])"
    expected = pytest.raises(RegistryUnavailable, match="claim q: Redis cannot serve it now: ")
    with expected, redis_errors("claim q"):
        client.eval(script, 0, reply)


def test_any_other_error_reply_is_still_a_broken_registry(client: redis.Redis) -> None:
    with pytest.raises(RegistryError) as caught, redis_errors("claim q"):
        client.eval("return redis.error_reply(ARGV[1])", 0, "WRONGTYPE not a sorted set")
    assert not isinstance(caught.value, RegistryUnavailable)
