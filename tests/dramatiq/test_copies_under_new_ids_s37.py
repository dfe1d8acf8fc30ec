"""A message that carries an occurrence's options under another message id is not that
occurrence.

An actor that fans its own message out (`broker.enqueue(message.copy(message_id=...))`),
or a message of another deployment's prefix, carried `emq_due_ms`, `emq_name` and the rest
under its own id: the worker reported each copy as the occurrence (three history entries a
slot, the copies' failures in the schedule's streak: they could pause it) and, under an
overlap policy, held the schedule in flight while they ran (a probe of Dramatiq
compositions, session 37). A message is now an occurrence only when its id is the one a pump
gives it (`is_occurrence_id`); a copy is processed as a plain message. A real
`dramatiq.Worker`, the registry on the test server.
"""

from __future__ import annotations

import uuid

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage
from processes import wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.dramatiq import DramatiqDispatcher, RecurringMiddleware, recurring


def test_copies_of_an_occurrence_under_new_ids_run_as_plain_messages(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    broker = StubBroker()
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False, source="s37copies"))
    ran: list[tuple[str, bool]] = []

    @recurring(every="1h", overlap="skip", pause_after_failures=2, immediately=True)
    @dramatiq.actor(broker=broker, queue_name="s37fan", max_retries=0)
    def fan() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        copy = bool(message.options.get("fanned"))
        ran.append((message.message_id, copy))
        if copy:
            raise ValueError("a copy fails")
        for _ in range(2):
            broker.enqueue(message.copy(message_id=str(uuid.uuid4()), options={"fanned": True}))

    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
    worker.start()  # syncs the schedule
    try:
        (sent,) = Pump(repeat, ["s37fan"], DramatiqDispatcher(broker)).run_once().dispatched
        broker.join("s37fan", fail_fast=False)
        worker.join()
        assert sorted(copy for _, copy in ran) == [False, True, True]

        def reported() -> bool:  # the reporter sends from its own thread
            return [e.status for e in repeat.history("s37fan", "fan")] == ["succeeded"]

        wait_until(reported, 10, "the occurrence's report")
        (entry,) = repeat.history("s37fan", "fan")
        assert entry.id == sent.id
        registration = repeat.get("s37fan", "fan")
        assert registration is not None and not registration.paused
        assert "carries the options of an occurrence of s37fan/fan but not its id" in caplog.text
    finally:
        worker.stop()
