"""Shared fixtures: a real Redis-protocol server, isolated key prefixes, RabbitMQ.

The server is `$REDIS_URL` when set, else an embedded valkey-server started once per run.
Each test gets its own key prefix, so tests never see each other's keys and nothing is
ever flushed.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import settings
from registry_state import drop_prefix

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.testing import fake_repeat

# Hypothesis' per-example deadline (200 ms) is a timing assertion, which a loaded CI machine
# trips (a cron oracle example took 463 ms on a busy 2-CPU box): tests check behaviour only.
settings.register_profile("emq-bridge", deadline=None)
settings.load_profile("emq-bridge")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"t{uuid.uuid4().hex[:10]}"
    yield value
    url = os.environ.get("REDIS_URL")
    if url:  # a server that outlives the run (the system Redis): leave nothing of the test
        _drop_prefix(url, value)


def _drop_prefix(url: str, prefix: str) -> None:
    with redis.Redis.from_url(url) as connection:
        drop_prefix(connection, prefix)


@pytest.fixture
def repeat(client: redis.Redis, prefix: str) -> Repeat:
    return Repeat(client, prefix)


@pytest.fixture(params=["server", "fakeredis"])
def any_repeat(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Repeat]:
    """The registry on the real server and on fakeredis: the same tests must pass on both."""
    if request.param == "fakeredis":
        yield fake_repeat(prefix)
        return
    connection = redis.Redis.from_url(redis_url)
    yield Repeat(connection, prefix)
    connection.close()


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """RabbitMQ at 127.0.0.1:5672 (or `$RABBITMQ_URL`). Fails in CI when missing; skips locally."""
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    if not _reachable("127.0.0.1", 5672) and "RABBITMQ_URL" not in os.environ:
        if IN_CI:
            pytest.fail(
                "RabbitMQ is not reachable at 127.0.0.1:5672 and CI=true: it must run in CI"
            )
        pytest.skip("RabbitMQ is not reachable at 127.0.0.1:5672 (runs in CI)")
    return url
