"""What the registry holds under a test's prefix, to compare before and after a command."""

from __future__ import annotations

import os
from typing import Any

import redis

from emq_bridge import Repeat


def drop_prefix(client: redis.Redis, prefix: str) -> None:
    """Delete every key under `prefix` (a test's own) on a server that outlives the run
    (`REDIS_URL`, the system Redis): keys left behind slow every later SCAN of it, so repeated
    runs would grow slower. An embedded server dies with the run: nothing to do."""
    if not os.environ.get("REDIS_URL"):
        return
    try:
        # `{prefix}*`: a test's registries under prefixes made from its own (`{prefix}x`),
        # and the kombu bindings of its queues (`_kombu.binding.{prefix}-q`).
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for pattern in (f"_kombu.binding.{prefix}*", f"_kombu.binding_permanent.{prefix}*"):
            keys += client.scan_iter(match=pattern, count=1000)
        for start in range(0, len(keys), 1000):
            client.unlink(*keys[start : start + 1000])
    except redis.RedisError:
        pass  # the test stopped the server (a fault test): nothing to clean


def snapshot(repeat: Repeat) -> dict[str, Any]:
    """Every key under the test's prefix with its full value: a zset's scores, a hash's
    fields, a list's items."""
    state: dict[str, Any] = {}
    for raw in repeat.client.scan_iter(match=f"{repeat.prefix}:*"):
        key = raw.decode()
        kind = repeat.client.type(key).decode()
        if kind == "zset":
            state[key] = repeat.client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            state[key] = repeat.client.hgetall(key)
        else:
            state[key] = repeat.client.lrange(key, 0, -1) if kind == "list" else kind
    return state
