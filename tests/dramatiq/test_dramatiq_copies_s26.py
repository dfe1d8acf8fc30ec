"""Copies of a Dramatiq occurrence, delivered twice, neither run an attempt again nor
overwrite its stored result (found by a probe, session 26).

* A copy of an attempt that failed and waits for its retry (`retrying`) ran again: its
  retry comes as the next attempt, so the copy is one of an attempt that ended. With every
  attempt failing, 5 runs instead of 3.
* A copy dropped as such raised `SkipMessage`, on which Dramatiq's `Results` stores `None`
  under the message id, the occurrence's: the result of the run that happened was lost.

A real `dramatiq.Worker` on a `StubBroker` with Dramatiq's `Results` (its stub backend), the
registry on the test server.
"""

from __future__ import annotations

from dataclasses import replace

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend
from processes import wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.dramatiq import DramatiqDispatcher, RecurringMiddleware, recurring
from emq_bridge.dramatiq.dispatch import build_message
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher


def test_a_copy_of_an_attempt_waiting_for_its_retry_is_a_copy(any_repeat: Repeat) -> None:
    any_repeat.upsert(
        "q", "job", every="1h", immediately=True, template={"task": "t"}, overlap="skip"
    )
    (sent,) = Pump(any_repeat, ["q"], RecordingDispatcher()).run_once().dispatched
    start = report_of("started", sent, attempt=1)
    assert any_repeat.begin_verdict(start) == "run"
    any_repeat.report([start, report_of("retrying", sent, attempt=1, error="ValueError: x")])
    assert any_repeat.begin_verdict(start) == "copy"  # attempt 1 again: a copy
    assert any_repeat.begin_verdict(report_of("started", sent, attempt=2)) == "run"  # its retry


@pytest.fixture
def results_broker(repeat: Repeat) -> StubBroker:
    broker = StubBroker()
    broker.add_middleware(Results(backend=StubBackend()))
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False, source="s26copies"))
    return broker


def test_a_dropped_copy_leaves_the_result_of_the_run(
    repeat: Repeat, results_broker: StubBroker
) -> None:
    broker = results_broker

    @recurring(every="1h", overlap="skip", immediately=True)
    @dramatiq.actor(broker=broker, queue_name="s26res", store_results=True, max_retries=0)
    def res_job() -> str:
        return "the real result"

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()  # syncs the schedule
    try:
        dispatcher = DramatiqDispatcher(broker)
        (sent,) = Pump(repeat, ["s26res"], dispatcher).run_once().dispatched
        broker.join("s26res")
        worker.join()
        probe = build_message(broker, sent)
        backend = next(m for m in broker.middleware if isinstance(m, Results)).backend
        assert probe.get_result(backend=backend) == "the real result"

        def reported() -> bool:  # the reporter sends from its own thread
            return [e.status for e in repeat.history("s26res", "res_job")] == ["succeeded"]

        wait_until(reported, 10, "the run's report")
        broker.enqueue(build_message(broker, replace(sent, redelivered=True)))  # the copy
        broker.join("s26res")
        worker.join()
        assert probe.get_result(backend=backend) == "the real result"
        assert reported()
    finally:
        worker.stop()
