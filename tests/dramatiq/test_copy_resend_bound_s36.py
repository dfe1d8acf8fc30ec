"""A copy of a guarded occurrence delivered while its run is heartbeated is delivered again a
bounded number of times (session 36; the Celery side, with real workers killing their
processes, is tests/celery/test_poison_copy_resends_s36.py).

Each delivery again is a new message, whose broker delivery count (a RabbitMQ quorum queue's
`x-delivery-limit`) starts again: an actor that kills its worker ran for ever. The copy
enqueued again carries how often it was (`emq_bridge_resent`); past `MAX_RESENDS` it is
dropped with a WARNING. The middleware's own hook, on a `StubBroker`, against a real
registry, as test_fix_copy_of_a_running_occurrence.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name
from dramatiq.middleware import SkipMessage

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.dramatiq import RecurringMiddleware
from emq_bridge.dramatiq.dispatch import build_message
from emq_bridge.dramatiq.middleware import RESENT_OPTION
from emq_bridge.lifecycle import MAX_RESENDS
from emq_bridge.testing import RecordingDispatcher


@pytest.fixture
def broker(repeat: Repeat) -> Iterator[tuple[StubBroker, RecurringMiddleware]]:
    stub = StubBroker()
    middleware = RecurringMiddleware(repeat, run_pump=False, sync_at_boot=False, heartbeat_s=1.0)
    stub.add_middleware(middleware)
    dramatiq.actor(lambda: None, broker=stub, actor_name="job", queue_name="q")
    yield stub, middleware
    middleware.outcomes.close(1.0)
    stub.close()


def running_slot(repeat: Repeat) -> Occurrence:
    repeat.register(
        "q", "job", every="1h", template={"task": "job"}, overlap="skip", immediately=True
    )
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    [occurrence] = sent.clear()
    assert repeat.begin(occurrence) and repeat.started(occurrence)  # it runs elsewhere
    return occurrence


def test_a_copy_is_delivered_again_counted_then_dropped_past_the_bound(
    repeat: Repeat,
    broker: tuple[StubBroker, RecurringMiddleware],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub, middleware = broker
    occurrence = running_slot(repeat)
    copy = build_message(stub, occurrence)
    queue = stub.queues[dq_name("q")].queue
    for times in range(MAX_RESENDS):
        with pytest.raises(SkipMessage, match="runs elsewhere"):
            middleware.before_process_message(stub, copy)
        copy = dramatiq.Message.decode(queue.popleft())
        assert copy.message_id == occurrence.id
        assert copy.options[RESENT_OPTION] == times + 1
    with (
        caplog.at_level(logging.WARNING, logger="emq_bridge"),
        pytest.raises(SkipMessage, match="delivered again too often"),
    ):
        middleware.before_process_message(stub, copy)
    assert not queue  # not enqueued again
    assert f"delivered again {MAX_RESENDS} times already" in caplog.text
