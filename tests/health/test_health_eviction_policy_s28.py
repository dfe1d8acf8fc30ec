"""`emq-bridge health` names a maxmemory-policy that evicts any key (healthy or not, without
changing the result): the pump warned only in its own boot log, and when an eviction then
removed a queue's registry, `health` said the queue had none with no hint why."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from cli_runs import cli_runner

from emq_bridge import Pump, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.health import check
from emq_bridge.testing import RecordingDispatcher


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as started:
        yield started


def test_an_evicting_policy_is_named_healthy_or_not(server: EmbeddedServer) -> None:
    client = redis.Redis.from_url(server.url)
    repeat = Repeat(client, "ev")
    repeat.register("reports", "digest", every="1h", template={"task": "t"})
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    pump.step()  # a heartbeat: healthy
    found = check(repeat)
    assert found.ok and "warning" not in found.reason
    assert found.eviction_policy == "noeviction"

    client.config_set("maxmemory-policy", "allkeys-lru")
    found = check(repeat)
    assert found.ok and found.eviction_policy == "allkeys-lru"
    assert found.reason.endswith(
        "(warning: maxmemory-policy is allkeys-lru: Redis may evict schedules; set it to "
        "noeviction)"
    )
    run = cli_runner(server.url, "ev")
    result = run("health", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["eviction_policy"] == "allkeys-lru"

    client.delete(repeat.keys("reports").registry)  # as an eviction would
    result = run("health", "--queue", "reports")
    assert result.exit_code == 4
    assert "has no registry" in result.stderr and "allkeys-lru" in result.stderr
    pump.heartbeat.remove(repeat)
    client.close()
