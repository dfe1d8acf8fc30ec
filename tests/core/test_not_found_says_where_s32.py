"""A read command that finds nothing says which Redis it searched (a new user's walkthrough:
the app wrote to its broker's Redis, `emq-bridge show` read `$REDIS_URL`'s default, and
"no registration 'proj.morning_digest' in queue 'celery'" did not say where it looked)."""

from __future__ import annotations

import pytest
from cli_runs import cli_runner, one_error_line

from emq_bridge.urls import redact_url


@pytest.mark.parametrize(
    "command", ["show", "history", "pause", "resume", "trigger", "remove", "backfill"]
)
def test_an_unknown_schedule_names_the_server_and_prefix(
    redis_url: str, prefix: str, command: str
) -> None:
    run = cli_runner(redis_url, prefix)
    extra = (
        ["--from", "2020-01-01T00:00Z", "--to", "2020-01-02T00:00Z"]
        if command == "backfill"
        else []
    )
    line = one_error_line(run(command, "celery", "proj.digest", *extra), 1)
    where = f"{redact_url(redis_url)} (prefix {prefix!r})"
    assert line == f"Error: no registration 'proj.digest' in queue 'celery' at {where}"


def test_an_empty_list_names_the_server_and_prefix(redis_url: str, prefix: str) -> None:
    run = cli_runner(redis_url, prefix)
    where = f"{redact_url(redis_url)} (prefix {prefix!r})"
    assert run("list").stderr.strip() == f"no schedules at {where}"
    in_queue = run("list", "celery")
    assert in_queue.stderr.strip() == f"no schedules in queue 'celery' at {where}"


def test_credentials_are_not_shown(redis_url: str, prefix: str) -> None:
    secret_url = redis_url.replace("redis://", "redis://:s3cret@", 1)
    run = cli_runner(secret_url, prefix)
    result = run("show", "celery", "proj.digest")
    assert "s3cret" not in result.output
