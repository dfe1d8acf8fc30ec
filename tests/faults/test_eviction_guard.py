"""Eviction guard: a pump warns loudly at start when Redis may evict registry keys.

Registry keys carry no TTL, so only the `allkeys-*` policies can evict them (celery-redbeat
users lost schedules this way); `noeviction` and the `volatile-*` policies cannot.
"""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

pytestmark = pytest.mark.faults


def warnings_about_eviction(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "emq_bridge.registry"
        and r.levelno >= logging.WARNING
        and "maxmemory-policy" in r.getMessage()
    ]


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_pump_warns_loudly_when_redis_may_evict_registry_keys(
    own_client: redis.Redis, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    own_client.config_set("maxmemory-policy", policy)
    pump = Pump(Repeat(own_client, "ev"), ["q"], RecordingDispatcher())
    assert pump.check_eviction_policy() == policy
    [message] = warnings_about_eviction(caplog)
    assert policy in message
    assert "noeviction" in message


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-lfu", "volatile-ttl"])
def test_a_pump_stays_quiet_when_the_policy_cannot_evict_keys_without_a_ttl(
    own_client: redis.Redis, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    own_client.config_set("maxmemory-policy", policy)
    pump = Pump(Repeat(own_client, "ev"), ["q"], RecordingDispatcher())
    assert pump.check_eviction_policy() == policy
    assert warnings_about_eviction(caplog) == []


def test_a_running_pump_checks_the_policy_once_at_start(
    own_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    own_client.config_set("maxmemory-policy", "allkeys-lru")
    pump = Pump(Repeat(own_client, "ev"), ["q"], RecordingDispatcher(), max_sleep_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,))
    thread.start()
    stop.wait(0.5)
    stop.set()
    thread.join(5)
    assert len(warnings_about_eviction(caplog)) == 1


def test_a_running_pump_warns_once_when_the_policy_changes_under_it(
    own_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    own_client.config_set("maxmemory-policy", "noeviction")
    pump = Pump(Repeat(own_client, "ev"), ["q"], RecordingDispatcher(), max_sleep_s=0.02)
    pump.eviction_check_s = 0.05
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,))
    thread.start()
    try:
        stop.wait(0.3)
        assert warnings_about_eviction(caplog) == []
        own_client.config_set("maxmemory-policy", "allkeys-lru")  # an operator's change
        stop.wait(0.5)
    finally:
        stop.set()
        thread.join(5)
    [message] = warnings_about_eviction(caplog)  # once, though checked several times
    assert "allkeys-lru" in message


def test_pump_once_checks_the_policy(
    own_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    from click.testing import CliRunner

    from emq_bridge.cli import cli

    own_client.config_set("maxmemory-policy", "allkeys-random")
    url = "redis://{host}:{port}/0".format(**own_client.connection_pool.connection_kwargs)
    result = CliRunner().invoke(
        cli, ["--redis-url", url, "--prefix", "ev", "pump", "q", "--list-key", "out", "--once"]
    )
    assert result.exit_code == 0, result.output
    assert "maxmemory-policy is allkeys-random" in result.output + caplog.text
