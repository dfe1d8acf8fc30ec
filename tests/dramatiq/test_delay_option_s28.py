"""A Dramatiq schedule's `options={"delay": ...}` (or `eta`) was accepted and silently ignored:
`delay` is an argument of `broker.enqueue` (`send_with_options(delay=...)`), not a message
option, so each occurrence went out on time (a probe on RabbitMQ saw it run 0.75 s after the
send for a 4 s delay). It is now refused before anything is written, naming what to use."""

from __future__ import annotations

import dramatiq
import pytest
import redis
from cli_runs import key_count
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import register
from emq_bridge.dramatiq.message_options import message_option_error
from emq_bridge.errors import ScheduleError


@pytest.mark.parametrize("key", ["delay", "eta"])
def test_an_enqueue_argument_in_the_options_is_refused_and_nothing_written(
    key: str, client: redis.Redis, prefix: str
) -> None:
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job() -> None:
        pass

    with pytest.raises(ScheduleError, match=rf"option '{key}' is an argument of broker.enqueue"):
        register(Repeat(client, prefix), job, every="1h", options={key: 4000})
    assert key_count(client, prefix) == 0
    error = message_option_error({key: 4000})
    assert error is not None and "offset=" in error


def test_the_other_options_are_still_taken(client: redis.Redis, prefix: str) -> None:
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job() -> None:
        pass

    assert register(Repeat(client, prefix), job, every="1h", options={"max_retries": 1})
