"""What the registry holds under a test's prefix, to compare before and after a command."""

from __future__ import annotations

from typing import Any

from emq_bridge import Repeat


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
