"""Fixtures of the migration tests: the CLI on the test registry, a celery-redbeat app."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from cli_run import Run
from click.testing import CliRunner, Result

from emq_bridge.cli import cli


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix."""
    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args], **kwargs)

    return invoke


@pytest.fixture
def redbeat_app(redis_url: str) -> Iterator[Celery]:
    """A Celery app whose celery-redbeat entries live on the test server, under a key prefix
    of their own (`app.redbeat_conf.key_prefix`)."""
    app = Celery("rb", broker=redis_url, set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, redbeat_key_prefix=f"rb{uuid.uuid4().hex[:8]}:")
    yield app


@pytest.fixture
def old(redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    """celery-redbeat's Redis (the test server) and a key prefix of the test's own."""
    client = redis.Redis.from_url(redis_url)
    key_prefix = f"rb{uuid.uuid4().hex[:8]}:"
    yield client, key_prefix
    keys = list(client.scan_iter(match=key_prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()
