"""Options Dramatiq or emq-bridge write on each message were taken from a schedule and sent:
`options={"retries": 3}` started every occurrence on its fourth attempt (so `Retries` gave
up three retries early and the history said attempt 4), and `emq_guarded` asked a worker
for the overlap check of a schedule that has none. They are now refused before anything is
written, in the decorator, `register`, `emq-bridge add --dramatiq` and a worker's file."""

from __future__ import annotations

from pathlib import Path

import dramatiq
import pytest
import redis
from add_cli import add, keys
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Repeat
from emq_bridge.definition import Declaration, define
from emq_bridge.dramatiq import recurring, register
from emq_bridge.dramatiq.message_options import message_option_error
from emq_bridge.dramatiq.schedule import check_actors
from emq_bridge.errors import ConfigError, ScheduleError

PER_MESSAGE = [
    "retries",
    "traceback",
    "requeue_timestamp",
    "redis_message_id",
    "group_completion_uuid",
    "group_completion_callbacks",
    "emq_guarded",
    "emq_due_ms",
]


@pytest.mark.parametrize("key", PER_MESSAGE)
def test_an_option_written_on_each_message_is_named(key: str) -> None:
    assert message_option_error({key: 1}) == (
        f"option '{key}' is written on each message by Dramatiq or emq-bridge, "
        "not set by a schedule"
    )


def test_the_decorator_and_register_refuse_them_and_write_nothing(
    client: redis.Redis, prefix: str
) -> None:
    with pytest.raises(ScheduleError, match=r"^option 'retries' is written on each message"):
        recurring(every="1m", options={"retries": 3})
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job() -> None:
        pass

    with pytest.raises(ScheduleError, match=r"^option 'emq_guarded' is written on each"):
        register(Repeat(client, prefix), job, every="1h", options={"emq_guarded": True})
    assert keys(client, prefix) == []
    assert register(Repeat(client, prefix), job, every="1h", options={"max_retries": 3})


def test_add_refuses_them_with_one_line_and_writes_nothing(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    refused = add(tmp_path, redis_url, prefix, "--options", '{"retries": 3}')
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("Error: --options: option 'retries' is written on each message"), line
    assert keys(client, prefix) == []


def test_a_schedule_file_with_them_is_refused_at_the_workers_check() -> None:
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job() -> None:
        pass

    template = {"task": "job", "options": {"redis_message_id": "fixed"}}
    declaration = Declaration("q", "job", define(every="1m", template=template))
    with pytest.raises(ConfigError, match=r"schedule q/job: option 'redis_message_id' is"):
        check_actors(broker, [declaration], "schedules.toml")


def test_a_key_that_is_not_text_is_shown_not_raised() -> None:
    assert message_option_error({1: "x", "my_option": 2}) is None
