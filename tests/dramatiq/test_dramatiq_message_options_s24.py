"""A schedule's Dramatiq message options that Dramatiq's own middleware cannot use are refused
before anything is written: `emq-bridge add --dramatiq SPEC --options ...` (one line, exit 1)
and a worker's schedule file (its boot check). `{"max_retries": "many"}` used to be stored,
and `Retries` then failed in the worker after the actor raised: no retry, no clear error."""

from __future__ import annotations

from pathlib import Path

import dramatiq
import pytest
import redis
from add_cli import add, keys
from dramatiq.brokers.stub import StubBroker

from emq_bridge.definition import Declaration, define
from emq_bridge.dramatiq import recurring
from emq_bridge.dramatiq.message_options import message_option_error
from emq_bridge.dramatiq.schedule import check_actors
from emq_bridge.errors import ConfigError, ScheduleError


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_retries": "many"}, "option 'max_retries' must be a whole number of a count"),
        ({"max_retries": True}, "option 'max_retries' must be a whole number"),
        ({"time_limit": -1}, "option 'time_limit' must be a whole number of milliseconds"),
        ({"max_age": 1.5}, "option 'max_age' must be a whole number of milliseconds"),
        ({"min_backoff": "1s"}, "option 'min_backoff' must be a whole number"),
        ({"on_failure": 3}, "option 'on_failure' must name an actor"),
        ({"throws": "ValueError"}, "option 'throws' holds Python objects"),
    ],
)
def test_options_dramatiqs_middleware_cannot_use_are_named(
    options: dict[str, object], error: str
) -> None:
    found = message_option_error(options)
    assert found is not None and found.startswith(error), found


def test_options_it_can_use_or_does_not_read_pass() -> None:
    good = {"max_retries": 0, "time_limit": 60_000, "max_age": 3_600_000, "min_backoff": 100}
    assert message_option_error({**good, "on_success": "log_it", "priority": 5}) is None
    assert message_option_error({"my_middleware_option": "anything"}) is None


def test_add_refuses_them_with_one_line_and_writes_nothing(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    refused = add(tmp_path, redis_url, prefix, "--options", '{"max_retries": "many"}')
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("Error: --options: option 'max_retries' must be a whole number"), line
    assert line.endswith("(nothing written)")
    assert keys(client, prefix) == []
    accepted = add(tmp_path, redis_url, prefix, "--options", '{"max_retries": 2}')
    assert accepted.returncode == 0, accepted.stderr


def test_a_schedule_file_with_them_is_refused_at_the_workers_check() -> None:
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job() -> None:
        pass

    template = {"task": "job", "options": {"time_limit": "1m"}}
    declaration = Declaration("q", "job", define(every="1m", template=template))
    with pytest.raises(ConfigError, match=r"schedules\.toml: schedule q/job: option 'time_limit'"):
        check_actors(broker, [declaration], "schedules.toml")


def test_a_decorator_with_them_raises_at_import_time() -> None:
    with pytest.raises(ScheduleError, match="option 'max_retries' must be a whole number"):
        recurring(every="1m", options={"max_retries": "many"})
