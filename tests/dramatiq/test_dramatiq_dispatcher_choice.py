"""The automatic dispatcher choice: pipelined on a RedisBroker, the same messages either way.

`RecurringMiddleware(pipelined=None)` (the default) and `emq-bridge pump --dramatiq` send
through `dramatiq_dispatcher`: `PipelinedDramatiqDispatcher` on a `RedisBroker` whose
enqueue is Dramatiq's own, one `broker.enqueue` per message anywhere else. What a worker
sees must not depend on the choice: the messages are compared field by field, and a real
worker consumes distinct-argument registrations sent through the default path.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, Middleware
from quiet import quiet_offset

from emq_bridge import ConfigError, Pump, Repeat, occurrence_id
from emq_bridge.definition import define
from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    PipelinedDramatiqDispatcher,
    RecurringMiddleware,
    current_occurrence,
)
from emq_bridge.dramatiq.dispatch import can_pipeline, dramatiq_dispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000
KWARGS = {"report": "daily", "limit": 100}


class Hooks(Middleware):
    """Records each enqueue hook with the message's ids, as a broker's middleware sees it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        self.calls.append(("before", message.message_id, message.options["redis_message_id"]))

    def after_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        self.calls.append(("after", message.message_id, message.options["redis_message_id"]))


class OwnEnqueue(RedisBroker):
    """A RedisBroker that sends as it decides: the fast path would bypass it."""

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        return super().enqueue(message, delay=delay)


@pytest.fixture
def redis_broker(redis_url: str) -> Any:
    broker = RedisBroker(url=redis_url, namespace=f"ns{uuid.uuid4().hex[:10]}")
    yield broker
    broker.close()


# -- the choice --------------------------------------------------------------------------


def test_the_automatic_choice_is_pipelined_on_a_redis_broker(redis_broker: RedisBroker) -> None:
    assert can_pipeline(redis_broker)
    assert type(dramatiq_dispatcher(redis_broker)) is PipelinedDramatiqDispatcher
    assert RecurringMiddleware().pipelined is None  # the default is automatic


def test_pipelined_false_opts_out_and_true_insists(redis_broker: RedisBroker) -> None:
    assert type(dramatiq_dispatcher(redis_broker, False)) is DramatiqDispatcher
    assert type(dramatiq_dispatcher(redis_broker, True)) is PipelinedDramatiqDispatcher
    with pytest.raises(ConfigError, match="needs a RedisBroker"):
        dramatiq_dispatcher(StubBroker(), True)


def test_other_brokers_keep_one_enqueue_per_message(rabbitmq_url: str) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    for broker in (StubBroker(), RabbitmqBroker(url=rabbitmq_url, confirm_delivery=True)):
        try:
            assert not can_pipeline(broker)
            assert type(dramatiq_dispatcher(broker)) is DramatiqDispatcher
        finally:
            broker.close()


def test_a_redis_broker_whose_enqueue_is_not_dramatiqs_own_keeps_it(redis_url: str) -> None:
    subclass = OwnEnqueue(url=redis_url, namespace=f"ns{uuid.uuid4().hex[:10]}")
    patched = RedisBroker(url=redis_url, namespace=f"ns{uuid.uuid4().hex[:10]}")
    patched.enqueue = lambda message, *, delay=None: message  # type: ignore[method-assign]
    try:
        for broker in (subclass, patched):
            assert not can_pipeline(broker)
            assert type(dramatiq_dispatcher(broker)) is DramatiqDispatcher
    finally:
        subclass.close()
        patched.close()


@pytest.mark.parametrize("bad", ["yes", 1, 0])
def test_a_pipelined_setting_that_is_not_a_bool_or_none_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="True, False or None"):
        RecurringMiddleware(pipelined=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="True, False or None"):
        dramatiq_dispatcher(StubBroker(), bad)  # type: ignore[arg-type]


# -- what is sent -----------------------------------------------------------------------


def _sent(
    client: redis.Redis, redis_url: str, prefix: str, queue: str, pipelined: bool | None
) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """Fire 40 distinct-argument registrations through one path; return the stored messages
    (ordered by id) and the enqueue hooks the broker's middleware saw."""
    broker = RedisBroker(url=redis_url, namespace=f"ns{uuid.uuid4().hex[:10]}")
    hooks = Hooks()
    broker.add_middleware(hooks)
    try:
        dramatiq.actor(lambda *a, **k: None, broker=broker, actor_name="job", queue_name=queue)
        repeat = Repeat(client, prefix)
        items = [
            (
                queue,
                f"r{i:03d}",
                define(
                    every="1h",
                    template={
                        "task": "job",
                        "args": [i, 2],
                        "kwargs": KWARGS,
                        "options": {"max_retries": i % 3},
                    },
                ),
            )
            for i in range(40)
        ]
        repeat.upsert_many(items, now_ms=T0)  # both runs: the same slot, the same clock
        dispatcher = dramatiq_dispatcher(broker, pipelined)
        expected = DramatiqDispatcher if pipelined is False else PipelinedDramatiqDispatcher
        assert type(dispatcher) is expected
        tick = Pump(repeat, [queue], dispatcher).run_once(now_ms=T0 + HOUR)
        assert len(tick.dispatched) == 40
        raw = client.hvals(f"{broker.namespace}:{queue}.msgs")
        client.delete(*client.keys(f"{broker.namespace}:*"))
    finally:
        broker.close()
    messages = sorted((json.loads(m) for m in raw), key=lambda m: m["message_id"])
    return messages, hooks.calls


def test_both_paths_write_the_same_messages_and_run_the_same_hooks(
    client: redis.Redis, redis_url: str
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    # A registry each: the same registrations, fired once through each path.
    prefix_a, prefix_b = f"t{uuid.uuid4().hex[:10]}", f"t{uuid.uuid4().hex[:10]}"
    one_by_one, hooks_a = _sent(client, redis_url, prefix_a, queue, False)
    pipelined, hooks_b = _sent(client, redis_url, prefix_b, queue, None)  # automatic
    assert len(one_by_one) == len(pipelined) == 40

    def seen_by_a_worker(message: dict[str, Any], prefix: str) -> dict[str, Any]:
        options = dict(message["options"])
        # Random, clock-made or prefix-made in both paths: checked for what they must be.
        assert uuid.UUID(options.pop("redis_message_id"))
        assert isinstance(message["message_timestamp"], int)
        assert options["emq_released_ms"] == T0 + HOUR
        name, due_ms = options["emq_name"], options["emq_due_ms"]
        assert message["message_id"] == occurrence_id(prefix, queue, name, due_ms)
        rest = {
            k: v
            for k, v in message.items()
            if k not in ("options", "message_id", "message_timestamp")
        }
        return {**rest, "options": options, "option_order": list(message["options"])}

    by_name_a = {m["options"]["emq_name"]: seen_by_a_worker(m, prefix_a) for m in one_by_one}
    by_name_b = {m["options"]["emq_name"]: seen_by_a_worker(m, prefix_b) for m in pipelined}
    assert by_name_a == by_name_b
    sample = by_name_a["r007"]
    assert sample["args"] == [7, 2] and sample["kwargs"] == KWARGS
    assert sample["options"]["max_retries"] == 1
    for calls, messages in ((hooks_a, one_by_one), (hooks_b, pipelined)):
        # Each message: one before_enqueue and one after_enqueue, with the ids it was stored with.
        stored = sorted((m["message_id"], m["options"]["redis_message_id"]) for m in messages)
        assert sorted(c[1:] for c in calls if c[0] == "before") == stored
        assert sorted(c[1:] for c in calls if c[0] == "after") == stored


# -- a real worker --------------------------------------------------------------------------


def test_a_worker_runs_each_distinct_registration_once_through_the_default_path(
    client: redis.Redis, redis_url: str, prefix: str
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=f"ns{uuid.uuid4().hex[:10]}")
    hooks = Hooks()
    middleware = RecurringMiddleware(prefix=prefix, max_sleep_s=0.5, sync_at_boot=False)
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(hooks)
    broker.add_middleware(middleware)
    seen_key = f"{prefix}:seen"

    def job(i: int, two: int, *, report: str, limit: int) -> None:
        message = CurrentMessage.get_current_message()
        info = current_occurrence()
        assert message is not None and info is not None
        entry = {"id": message.message_id, "name": info.name, "due_ms": info.due_ms, "i": i}
        client.rpush(seen_key, json.dumps({**entry, "rest": [two, report, limit]}))

    dramatiq.actor(job, broker=broker, actor_name="job", queue_name=queue)
    repeat = Repeat(client, prefix)
    n = 600  # two full batches of 500 after the slow start: 32, 128, then 440
    template = {"task": "job", "kwargs": KWARGS}
    offset = quiet_offset()  # a top of the hour mid-test would make all 600 due again
    items = [
        (
            queue,
            f"r{i:04d}",
            define(every="1h", offset=offset, template={**template, "args": [i, 2]}),
        )
        for i in range(n)
    ]
    repeat.upsert_many(items, now_ms=repeat.server_time_ms() - HOUR)
    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while client.llen(seen_key) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # room for a duplicate to show up, if there were one
        assert type(middleware.pump.dispatcher) is PipelinedDramatiqDispatcher  # type: ignore[union-attr]
    finally:
        worker.stop(timeout=10_000)
        broker.close()
    seen = [json.loads(raw) for raw in client.lrange(seen_key, 0, -1)]
    assert sorted(s["i"] for s in seen) == list(range(n))  # each once, with its own args
    assert all(s["rest"] == [2, "daily", 100] and s["name"] == f"r{s['i']:04d}" for s in seen)
    for entry in seen:
        assert entry["id"] == occurrence_id(prefix, queue, entry["name"], entry["due_ms"])
    ours = [c for c in hooks.calls if c[1] in {s["id"] for s in seen}]
    sent = [c for c in ours if c[0] == "before"]
    assert len(sent) == n and len([c for c in ours if c[0] == "after"]) == n
