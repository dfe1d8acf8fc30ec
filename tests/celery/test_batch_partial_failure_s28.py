"""A batch Redis took in part: only what it refused is reported failed and sent again.

The default Celery path sends a claimed batch in one pipeline. Before: that pipeline was kombu's
`Producer.batch()`, not a transaction, and a refusal of one command (a shared broker Redis out
of memory refuses each `LPUSH` from the one that no longer fits) reported the whole batch
failed though Redis held its first messages: after the lease they were sent a second time.

Real servers: the registry is the test Redis, the broker an embedded server of its own (its
`maxmemory` is squeezed). Time moves with the pump's `now_ms`, so nothing sleeps.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import DispatchError
from emq_bridge.occurrence import Occurrence

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
HOUR = 3_600_000
LEASE_MS = 5_000
COUNT = 60
PAD = "x" * 10_000  # each message about 16 kB in the broker (base64 body)
ROOM = 300_000  # bytes the broker has left when the batch is published: ~15 of its messages


def record(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def broker() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def broker_client(broker: EmbeddedServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(broker.url)
    yield connection
    connection.close()


@pytest.fixture
def app(broker: EmbeddedServer, prefix: str) -> Iterator[Celery]:
    app = Celery(f"app-{prefix}", broker=broker.url, set_as_current=False)
    app.conf.update(result_backend=None, task_default_queue=f"{prefix}-q")
    app.task(name="t.record", shared=False)(record)
    yield app
    app.close()


def message_ids(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


class Squeezed(CeleryDispatcher):
    """Another client of the shared broker Redis fills it between the claim and the publish:
    room is left for some of the batch's messages only."""

    def __init__(self, app: Celery, broker: redis.Redis) -> None:
        super().__init__(app)
        self.broker = broker
        self.squeeze = True

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        if self.squeeze:
            self.squeeze = False
            used = int(self.broker.info("memory")["used_memory"])
            self.broker.config_set("maxmemory", used + ROOM)
        return super().dispatch_batch(occurrences)


def test_a_batch_the_broker_refuses_in_part_is_sent_again_only_in_that_part(
    app: Celery, broker_client: redis.Redis, repeat: Repeat, prefix: str
) -> None:
    queue = f"{prefix}-q"
    for i in range(COUNT):
        repeat.register(
            queue, f"n{i}", every="1h", template={"task": "t.record", "args": [i, PAD]}, now_ms=T0
        )
    client = broker_client
    client.config_set("maxmemory-policy", "noeviction")
    dispatcher = Squeezed(app, client)
    # Its connection made and its queue declared before the squeeze: only messages need room.
    warm = Occurrence(queue, "warm", T0, str(uuid.uuid4()), {"task": "t.record"}, 0)
    assert CeleryDispatcher(app).dispatch_batch([warm]) == [None]
    client.delete(queue)
    pump = Pump(repeat, [queue], dispatcher, lease_ms=LEASE_MS)
    try:
        first = pump.run_once(now_ms=T0 + HOUR)
    finally:
        client.config_set("maxmemory", 0)  # the other client's data is gone again
    taken = message_ids(client, queue)
    assert 0 < len(taken) < COUNT  # the broker took part of the batch, refused the rest

    again = pump.run_once(now_ms=T0 + HOUR + LEASE_MS + 1)  # the leases expired: re-sent
    counts = Counter(message_ids(client, queue))
    assert [task_id for task_id, n in counts.items() if n > 1] == []  # none sent twice
    assert len(counts) == COUNT
    # Exactly what the broker held was reported sent (and acked), what it refused failed,
    # and only that was sent again.
    assert sorted(o.id for o in first.dispatched) == sorted(taken)
    failed = {o.id for o in first.failed}
    assert failed.isdisjoint(taken) and len(failed) + len(taken) == COUNT
    assert {o.id for o in again.dispatched} == failed
    assert all(o.redelivered for o in again.dispatched) and again.failed == []


def test_a_refused_queue_fails_only_its_own_messages_of_the_batch(
    app: Celery, broker_client: redis.Redis, prefix: str
) -> None:
    """A key the broker refuses to push to (another client made it a string) fails its
    messages; the messages of the batch to another queue are in and reported sent."""
    good, bad = f"{prefix}-good", f"{prefix}-bad"
    client = broker_client
    client.set(bad, "not a list")
    batch = [
        Occurrence(
            good if i % 2 else bad,
            f"n{i}",
            T0,
            f"00000000-0000-4000-8000-{i:012d}",
            {"task": "t.record", "args": [i]},
            0,
        )
        for i in range(6)
    ]
    errors = CeleryDispatcher(app).dispatch_batch(batch)
    sent = [o.id for o, e in zip(batch, errors, strict=True) if e is None]
    refused = [e for e in errors if e is not None]
    assert sent == [o.id for o in batch if o.queue == good]
    assert len(refused) == 3 and all(isinstance(e, DispatchError) for e in refused)
    assert all(f"{bad}/" in str(e) and "WRONGTYPE" in str(e) for e in refused)
    assert sorted(message_ids(client, good)) == sorted(sent)
    assert client.get(bad) == b"not a list"
