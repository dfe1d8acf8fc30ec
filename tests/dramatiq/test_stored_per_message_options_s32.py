"""A runtime schedule an earlier release stored with options Dramatiq or emq-bridge write on each
message (its `emq-bridge add --dramatiq` and `sync` took them; this release refuses them) was
still sent with them, silently: `retries: 2` made an actor with `max_retries=3` run 2 times
instead of 4 (its history said attempt 4), and `emq_guarded`/`emq_x` reached the message too
(found by session 32's upgrade probe). The dispatchers now leave them out of the message, with
one WARNING per registration and process naming them, as they do for a stored `delay`/`eta`.

Records written directly (`Repeat.upsert`, as the earlier release's `add` did, past the
Dramatiq check); a real `RedisBroker` on the test server, and a real `dramatiq.Worker`."""

from __future__ import annotations

import logging
import uuid

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from processes import wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    PipelinedDramatiqDispatcher,
    RecurringMiddleware,
    current_occurrence,
)

STORED = {
    "retries": 2,
    "max_retries": 5,  # the user's own: kept
    "traceback": "Traceback (most recent call last): ...",
    "group_completion_uuid": "g-1",
    "redis_message_id": "fixed",
    "emq_guarded": True,
    "emq_x": 1,
    "emq_due_ms": 1,
    "my_option": "kept",
}
DROPPED = [
    "retries",
    "traceback",
    "group_completion_uuid",
    "redis_message_id",
    "emq_guarded",
    "emq_x",
    "emq_due_ms",
]
NOW_MS = 1_899_936_000_000


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "written on each message" in r.getMessage()]


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_stored_per_message_option_is_left_out_and_said_once(
    redis_url: str, prefix: str, pipelined: bool, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    namespace = f"{prefix}-dq"
    broker = RedisBroker(url=redis_url, namespace=namespace)

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name="job")
    def job() -> None:
        pass

    repeat = Repeat(client, prefix)
    template = {"task": "job", "args": [], "kwargs": {}, "options": STORED}
    repeat.upsert(queue, "stored", every="1h", template=template, now_ms=NOW_MS)
    dispatcher = PipelinedDramatiqDispatcher(broker) if pipelined else DramatiqDispatcher(broker)
    caplog.set_level(logging.WARNING, logger="emq_bridge")
    pump = Pump(repeat, [queue], dispatcher)
    sent = []
    for hour in (1, 2):
        tick = pump.run_once(now_ms=NOW_MS + hour * 3_600_000)
        assert [o.name for o in tick.dispatched] == ["stored"]  # sent, as before
        sent.append(tick.dispatched[0])
    try:
        encoded = client.hvals(f"{namespace}:{queue}.msgs")
        messages = sorted(
            (dramatiq.Message.decode(raw) for raw in encoded), key=lambda m: m.options["emq_due_ms"]
        )
        assert [m.message_id for m in messages] == [o.id for o in sent]
        for message, occurrence in zip(messages, sent, strict=True):
            options = message.options
            assert not {"retries", "traceback", "group_completion_uuid", "emq_guarded"} & set(
                options
            ), options
            assert "emq_x" not in options
            assert options["emq_due_ms"] == occurrence.due_ms  # ours, not the stored 1
            assert options["max_retries"] == 5 and options["my_option"] == "kept"
            assert options["redis_message_id"] != "fixed"
        [warning] = said(caplog)
        assert warning.startswith(f"{queue}/stored: its options hold "), warning
        assert ", ".join(repr(k) for k in DROPPED) in warning
    finally:
        broker.close()
        client.close()


def test_a_stored_retries_no_longer_shortens_the_actors_retries(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`retries: 2` stored, an actor with `max_retries=3` that always raises: 4 runs, attempts
    1 to 4 (the earlier release's record ran it twice, as attempts 3 and 4)."""
    client = redis.Redis.from_url(redis_url)
    repeat = Repeat(client, prefix)
    queue = f"q{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dq")
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False, source="s32stored"))
    attempts: list[int] = []

    @dramatiq.actor(
        broker=broker,
        queue_name=queue,
        actor_name="always_fails",
        max_retries=3,
        min_backoff=10,
        max_backoff=50,
    )
    def always_fails() -> None:
        occurrence = current_occurrence()
        assert occurrence is not None
        attempts.append(occurrence.attempt)
        raise RuntimeError("down")

    template = {"task": "always_fails", "options": {"retries": 2}}
    repeat.upsert(queue, "stored", every="1h", immediately=True, template=template)
    caplog.set_level(logging.WARNING, logger="emq_bridge")
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        (sent,) = Pump(repeat, [queue], DramatiqDispatcher(broker)).run_once().dispatched

        def gave_up() -> bool:  # the last attempt's report, sent from the reporter's thread
            history = repeat.history(queue, "stored")
            return bool(history) and history[0].status == "failed"

        wait_until(gave_up, 20, "the occurrence's failure", then=lambda: attempts)
        broker.join(queue)
        worker.join()
        assert attempts == [1, 2, 3, 4]
        [entry] = repeat.history(queue, "stored")
        assert (entry.id, entry.attempt) == (sent.id, 4)
        assert len(said(caplog)) == 1
    finally:
        worker.stop()
        broker.close()
        client.close()
