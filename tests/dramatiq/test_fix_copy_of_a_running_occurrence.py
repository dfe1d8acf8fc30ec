"""A Dramatiq worker given a copy of a guarded occurrence whose first copy runs elsewhere,
heartbeated, does not run it: it enqueues it again, delayed until those heartbeats would
have lapsed, and reports nothing. When it comes back, it runs if they did lapse (the first
copy's worker died: RabbitMQ hands its message on at once), and is dropped if the first
copy ended. The middleware's own hook, on a `StubBroker`, against a real registry."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name
from dramatiq.middleware import SkipMessage

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.dramatiq import RecurringMiddleware
from emq_bridge.dramatiq.dispatch import build_message
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


def sent_slot(repeat: Repeat) -> Occurrence:
    repeat.register(
        "q", "job", every="1h", template={"task": "job"}, overlap="skip", immediately=True
    )
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    [occurrence] = sent.clear()
    return occurrence


def test_a_copy_comes_back_after_the_heartbeats_and_runs_if_they_lapsed(
    repeat: Repeat, broker: tuple[StubBroker, RecurringMiddleware]
) -> None:
    stub, middleware = broker
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence) and repeat.started(occurrence)  # it runs elsewhere
    copy = build_message(stub, occurrence)

    with pytest.raises(SkipMessage, match="runs elsewhere"):
        middleware.before_process_message(stub, copy)
    [raw] = stub.queues[dq_name("q")].queue
    delayed = dramatiq.Message.decode(raw)
    assert delayed.message_id == occurrence.id
    assert delayed.options["eta"] >= repeat.server_time_ms() + 3000  # 3 heartbeats of 1 s
    assert [e.status for e in repeat.history("q", "job")] == ["running"]  # nothing reported

    # Its first copy's worker died: its heartbeats lapsed, so the copy runs when it comes.
    member = f"{occurrence.name} {occurrence.due_ms}"
    repeat.client.zadd(repeat.keys("q").running, {member: 0})
    middleware.before_process_message(stub, copy)  # no SkipMessage: it runs


def test_a_copy_that_comes_back_after_the_first_copy_ended_is_dropped(
    repeat: Repeat, broker: tuple[StubBroker, RecurringMiddleware]
) -> None:
    stub, middleware = broker
    occurrence = sent_slot(repeat)
    assert repeat.begin(occurrence) and repeat.started(occurrence)
    assert repeat.finished(occurrence, ok=True)
    with pytest.raises(SkipMessage, match="ran already"):
        middleware.before_process_message(stub, build_message(stub, occurrence))
    assert not stub.queues[dq_name("q")].queue
    assert [e.status for e in repeat.history("q", "job")] == ["succeeded"]
