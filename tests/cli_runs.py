"""Running the CLI in the test's process on the test's server and prefix, and reading the
one line a refusal must print."""

from __future__ import annotations

from collections.abc import Callable

import redis
from click.testing import CliRunner, Result

from emq_bridge.cli import cli

Run = Callable[..., Result]


def cli_runner(redis_url: str, prefix: str) -> Run:
    """`emq-bridge --redis-url URL --prefix PREFIX ARGS` in this process; a traceback fails."""

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(
            cli, ["--redis-url", redis_url, "--prefix", prefix, *args], catch_exceptions=False
        )

    return invoke


def one_error_line(result: Result, code: int) -> str:
    """The one `Error: ...` line a refused command printed on stderr, exiting `code`."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), lines
    return lines[0]


def key_count(client: redis.Redis, prefix: str) -> int:
    """How many keys the test's prefix holds."""
    return sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))
