"""Fixtures of the migration tests: the CLI on the test registry, a celery-redbeat app."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
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
