"""Shared by the migration tests: the CLI on the test registry, and registry snapshots."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from emq_bridge import Repeat
from emq_bridge.cli import cli

Run = Callable[..., Result]


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix."""
    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args], **kwargs)

    return invoke


def snapshot(repeat: Repeat) -> dict[str, Any]:
    """Every key under the registry's prefix with its full value (zset scores, hash fields)."""
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
