"""Fixtures of the migration tests: the CLI on the test registry."""

from __future__ import annotations

from typing import Any

import pytest
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
