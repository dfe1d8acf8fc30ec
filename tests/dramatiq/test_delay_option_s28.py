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


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_stored_delay_from_an_earlier_release_is_said_once_and_sent_on_time(
    redis_url: str, prefix: str, pipelined: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A record an earlier release stored with `options={"delay": 5000}` (its `add` took it)
    is still sent on time, as before, but no longer silently (found by a probe of the
    upgrade: 117 sends on time, nothing said)."""
    import logging
    import uuid

    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge import Pump
    from emq_bridge.dramatiq import DramatiqDispatcher, PipelinedDramatiqDispatcher

    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dq")

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name="job")
    def job() -> None:
        pass

    repeat = Repeat(client, prefix)
    template = {"task": "job", "args": [], "kwargs": {}, "options": {"delay": 5000}}
    repeat.upsert(queue, "delayed", every="1h", template=template, now_ms=1_899_936_000_000)
    dispatcher = PipelinedDramatiqDispatcher(broker) if pipelined else DramatiqDispatcher(broker)
    caplog.set_level(logging.WARNING, logger="emq_bridge")
    pump = Pump(repeat, [queue], dispatcher)
    for hour in (1, 2):
        tick = pump.run_once(now_ms=1_899_936_000_000 + hour * 3_600_000)
        assert [o.name for o in tick.dispatched] == ["delayed"]  # sent, as before
    said = [r.getMessage() for r in caplog.records if "does not delay" in r.getMessage()]
    assert len(said) == 1 and f"{queue}/delayed: its options hold delay" in said[0]
    assert client.llen(f"{prefix}-dq:{queue}") == 2  # on the queue itself, not its .DQ
    broker.close()
