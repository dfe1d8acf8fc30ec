"""A message a middleware postpones (`SkipMessage`, and a copy enqueued with a delay) is the
same attempt of the same occurrence, as dramatiq.md says (a probe of Dramatiq compositions,
session 37: a guarded schedule behind such a middleware never ran, silently).

* under `allow` the copy runs, and its outcome replaces the entry's `skipped`;
* a guarded registration's worker drops it as a copy of an attempt that ran, saying so in
  an INFO line that names what runs the schedule instead;
* a middleware that bumps `retries` sends the next attempt, which a guarded worker runs.

A real `dramatiq.Worker`, the registry on the test server.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, SkipMessage
from processes import wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.dramatiq import DramatiqDispatcher, RecurringMiddleware, recurring


class Postpone(Middleware):  # type: ignore[misc]
    """Postpone each message once: enqueue a copy a moment later, skip this one."""

    def __init__(self, bump_retries: bool) -> None:
        self.bump_retries = bump_retries

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        if message.options.get("postponed"):
            return
        options: dict[str, Any] = {"postponed": True}
        if self.bump_retries:
            options["retries"] = message.options.get("retries", 0) + 1
        broker.enqueue(message.copy(options=options), delay=50)
        raise SkipMessage("postponed")


def _run_once(
    repeat: Repeat, overlap: str, bump_retries: bool, queue: str
) -> tuple[list[str], list[str]]:
    """Fire one occurrence through a worker whose middleware postpones it; return what ran
    and the statuses its history ends with."""
    broker = StubBroker()
    recurring_middleware = RecurringMiddleware(repeat, run_pump=False, source=queue)
    broker.add_middleware(recurring_middleware)
    broker.add_middleware(Postpone(bump_retries))
    ran: list[str] = []

    @recurring(every="1h", overlap=overlap, immediately=True)
    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=queue, max_retries=0)
    def job() -> None:
        ran.append("ran")

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        Pump(repeat, [queue], DramatiqDispatcher(broker)).run_once()
        for _ in range(2):  # the message, then its delayed copy
            broker.join(queue)
            broker.join(f"{queue}.DQ")
            worker.join()

        def settled() -> bool:
            return [e.status for e in repeat.history(queue, queue)] not in ([], ["running"])

        wait_until(settled, 10, "the reports")
        broker.join(queue)
        worker.join()
        assert recurring_middleware.flush_reports(5.0)
        return ran, [e.status for e in repeat.history(queue, queue)]
    finally:
        worker.stop()


def test_under_allow_the_postponed_copy_runs_and_its_outcome_stands(repeat: Repeat) -> None:
    ran, statuses = _run_once(repeat, "allow", False, "s37pa")
    assert ran == ["ran"]
    assert statuses == ["succeeded"]  # was: skipped, the run after it not recorded


def test_a_guarded_worker_drops_the_same_attempt_again_and_says_so(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        ran, statuses = _run_once(repeat, "skip", False, "s37pg")
    assert ran == []
    assert statuses == ["skipped"]
    assert "this attempt of its occurrence ran already" in caplog.text
    assert "emq-bridge trigger QUEUE NAME" in caplog.text


def test_a_guarded_worker_runs_the_next_attempt_a_postponing_middleware_sends(
    repeat: Repeat,
) -> None:
    ran, statuses = _run_once(repeat, "skip", True, "s37pn")
    assert ran == ["ran"]
    assert statuses == ["succeeded"]
