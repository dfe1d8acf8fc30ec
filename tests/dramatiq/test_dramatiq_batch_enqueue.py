"""The batch path of `PipelinedDramatiqDispatcher`: one script call writes Dramatiq's keys.

`lua/dramatiq_enqueue.lua` writes for each message what the `enqueue` command of Dramatiq's
own `dispatch` script writes. So the keys and values it leaves are compared with those
`broker.enqueue` leaves for the same messages, and a real `dramatiq` worker process
consumes a batch spread over two Dramatiq queues: each message once, as it was sent. The
middleware's `before_enqueue` still runs per message and refuses one message only.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.encoder import PickleEncoder
from dramatiq.middleware import Middleware, MiddlewareError

from emq_bridge import DispatchError, Pump, Repeat, occurrence_id
from emq_bridge.definition import define
from emq_bridge.dramatiq import DramatiqDispatcher, PipelinedDramatiqDispatcher, build_message
from emq_bridge.dramatiq.batch_enqueue import redis_message_id, redis_message_ids
from emq_bridge.dramatiq.dispatch import ENQUEUE_CALL_SIZE, can_pipeline, dramatiq_dispatcher
from emq_bridge.occurrence import Occurrence
from emq_bridge.template import freeze

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000


class Refuse(MiddlewareError):
    """What a middleware raises to refuse a message (Dramatiq lets `MiddlewareError` through)."""


class Gate(Middleware):
    """Refuses the messages whose first argument is in `refused`; breaks (a plain exception,
    which Dramatiq logs and ignores) on those in `broken`; records what it lets through."""

    def __init__(self, refused: Collection[int] = (), broken: Collection[int] = ()) -> None:
        self.refused, self.broken = set(refused), set(broken)
        self.before: list[str] = []
        self.after: list[str] = []

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        if message.args and message.args[0] in self.refused:
            raise Refuse(f"refused {message.args[0]}")
        if message.args and message.args[0] in self.broken:
            raise RuntimeError(f"broken on {message.args[0]}")
        self.before.append(message.message_id)

    def after_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        self.after.append(message.message_id)


@pytest.fixture
def namespace(client: redis.Redis) -> Iterator[str]:
    """A Dramatiq namespace of the test's own; its keys are removed afterwards."""
    name = f"ns{uuid.uuid4().hex[:10]}"
    yield name
    _drop(client, name)


def _drop(client: redis.Redis, namespace: str) -> None:
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        client.delete(*keys)


def _broker(redis_url: str, namespace: str, *middleware: Middleware) -> RedisBroker:
    broker = RedisBroker(url=redis_url, namespace=namespace)
    for m in middleware:
        broker.add_middleware(m)
    dramatiq.actor(lambda *a, **k: None, broker=broker, actor_name="a", queue_name="qa")
    dramatiq.actor(lambda *a, **k: None, broker=broker, actor_name="b", queue_name="qb")
    return broker


def _occurrences(n: int, queue: str = "sched") -> list[Occurrence]:
    """n occurrences, distinct args, alternating between actor a (queue qa) and b (qb)."""
    return [
        Occurrence(
            queue,
            f"r{i:04d}",
            T0,
            occurrence_id("t", queue, f"r{i:04d}", T0),
            freeze(
                {
                    "task": "ab"[i % 2],
                    "args": [i, "two"],
                    "kwargs": {"limit": i, "tag": f"é{i}"},
                    "options": {"max_retries": i % 3},
                }
            ),
            T0 + 5,
        )
        for i in range(n)
    ]


def _stored(client: redis.Redis, namespace: str) -> dict[str, Any]:
    """Every key of `namespace` (the namespace cut off its name) and its value."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(match=f"{namespace}:*", count=1000):
        key = raw.decode()[len(namespace) :]
        kind = client.type(raw).decode()
        if kind == "list":
            out[key] = [m.decode() for m in client.lrange(raw, 0, -1)]
        elif kind == "hash":
            out[key] = {k.decode(): v for k, v in client.hgetall(raw).items()}
        elif kind == "zset":
            out[key] = [m.decode() for m in client.zrange(raw, 0, -1)]
        else:
            out[key] = kind
    return out


# -- what is written ---------------------------------------------------------------------


def _compare_with_enqueue(client: redis.Redis, redis_url: str, n: int) -> None:
    """Send n messages through the batch path, then the same messages through
    `broker.enqueue` on another namespace: the keys, the lists and the stored bytes agree
    once each side's random ids (the Redis message ids, the broker id) are named alike."""
    ns_batch, ns_enqueue = f"ns{uuid.uuid4().hex[:10]}", f"ns{uuid.uuid4().hex[:10]}"
    batch_broker = _broker(redis_url, ns_batch)
    enqueue_broker = _broker(redis_url, ns_enqueue)
    try:
        errors = PipelinedDramatiqDispatcher(batch_broker).dispatch_batch(_occurrences(n))
        assert errors == [None] * n
        batch = _stored(client, ns_batch)
        # The same messages, one broker.enqueue each, in the order the batch path stored them.
        order = {q: batch[f":{q}"] for q in ("qa", "qb")}
        sent_ids: dict[str, list[str]] = {"qa": [], "qb": []}
        for queue, ids in order.items():
            for rid in ids:
                fields = dramatiq.get_encoder().decode(batch[f":{queue}.msgs"][rid])
                fields["options"].pop("redis_message_id")
                message = dramatiq.Message(**{**fields, "args": tuple(fields["args"])})
                sent_ids[queue].append(enqueue_broker.enqueue(message).options["redis_message_id"])
        enqueued = _stored(client, ns_enqueue)
    finally:
        batch_broker.close()
        enqueue_broker.close()
        _drop(client, ns_batch)
        _drop(client, ns_enqueue)

    assert set(batch) == set(enqueued) == {":qa", ":qa.msgs", ":qb", ":qb.msgs", ":__heartbeats__"}
    assert batch[":__heartbeats__"] == [batch_broker.broker_id]
    assert enqueued[":__heartbeats__"] == [enqueue_broker.broker_id]
    for queue in ("qa", "qb"):
        assert len(batch[f":{queue}"]) == (n + (queue == "qa")) // 2
        rename = dict(zip(sent_ids[queue], batch[f":{queue}"], strict=True))
        assert [rename[rid] for rid in enqueued[f":{queue}"]] == batch[f":{queue}"]
        entries = {
            rename[rid]: data.replace(rid.encode(), rename[rid].encode())
            for rid, data in enqueued[f":{queue}.msgs"].items()
        }
        assert entries == batch[f":{queue}.msgs"]  # byte for byte


def test_the_batch_writes_the_keys_and_bytes_broker_enqueue_writes(
    client: redis.Redis, redis_url: str
) -> None:
    _compare_with_enqueue(client, redis_url, 41)


def test_under_another_encoder_the_batch_writes_what_it_encodes(
    client: redis.Redis, redis_url: str
) -> None:
    default = dramatiq.get_encoder()
    dramatiq.set_encoder(PickleEncoder())
    try:
        _compare_with_enqueue(client, redis_url, 6)
    finally:
        dramatiq.set_encoder(default)


def test_a_batch_larger_than_one_call_keeps_each_queues_order(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    n = ENQUEUE_CALL_SIZE * 2 + 7
    broker = _broker(redis_url, namespace)
    try:
        occurrences = _occurrences(n)
        assert PipelinedDramatiqDispatcher(broker).dispatch_batch(occurrences) == [None] * n
        for queue, first in (("qa", 0), ("qb", 1)):
            ids = client.lrange(f"{namespace}:{queue}", 0, -1)
            stored = client.hmget(f"{namespace}:{queue}.msgs", ids)
            sent = [json.loads(raw)["message_id"] for raw in stored]
            assert sent == [o.id for o in occurrences[first::2]]
    finally:
        broker.close()


def test_redis_message_ids_are_version_4_uuids_as_enqueue_makes_them() -> None:
    alone = {redis_message_id() for _ in range(2000)}
    batched = set(redis_message_ids(2000))  # what a pipelined batch takes
    assert len(alone) == len(batched) == 2000
    ids = alone | batched
    assert len(ids) == 4000
    for rid in ids:
        parsed = uuid.UUID(rid)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, rid)


# -- middleware and failures ---------------------------------------------------------------


def test_a_before_enqueue_refusal_fails_that_message_only(
    client: redis.Redis, redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(refused={3, 8}, broken={5})
    broker = _broker(redis_url, namespace, gate)
    occurrences = _occurrences(12)
    try:
        with caplog.at_level(logging.CRITICAL):
            errors = PipelinedDramatiqDispatcher(broker).dispatch_batch(occurrences)
    finally:
        broker.close()
    assert [i for i, e in enumerate(errors) if e is not None] == [3, 8]
    assert all(isinstance(errors[i], Refuse) for i in (3, 8))
    # A hook raising anything else is logged and ignored, as Dramatiq's emit_before does.
    assert "Unexpected failure in before_enqueue" in caplog.text
    sent = [o.id for i, o in enumerate(occurrences) if i not in (3, 8)]
    stored = [
        json.loads(raw)["message_id"]
        for queue in ("qa", "qb")
        for raw in client.hvals(f"{namespace}:{queue}.msgs")
    ]
    assert sorted(stored) == sorted(sent)
    assert sorted(gate.after) == sorted(sent)  # after_enqueue for what was written only
    passed = [o.id for i, o in enumerate(occurrences) if i not in (3, 5, 8)]
    assert sorted(gate.before) == sorted(passed)


def test_a_queue_whose_key_holds_another_type_fails_its_messages_only(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    client.set(f"{namespace}:qb", "not a list")
    gate = Gate()
    broker = _broker(redis_url, namespace, gate)
    occurrences = _occurrences(10)
    try:
        errors = PipelinedDramatiqDispatcher(broker).dispatch_batch(occurrences)
    finally:
        broker.close()
    assert all(e is None for e in errors[0::2])  # actor a, queue qa
    for error in errors[1::2]:
        assert isinstance(error, DispatchError) and "WRONGTYPE" in str(error)
    assert client.llen(f"{namespace}:qa") == 5
    assert sorted(gate.after) == sorted(o.id for o in occurrences[0::2])


def test_a_broker_that_cannot_be_reached_fails_the_batch(redis_url: str) -> None:
    broker = _broker("redis://127.0.0.1:1/0", f"ns{uuid.uuid4().hex[:10]}")
    try:
        errors = PipelinedDramatiqDispatcher(broker).dispatch_batch(_occurrences(5))
    finally:
        broker.close()
    assert all(isinstance(e, DispatchError) for e in errors)
    assert "did not take the batch" in str(errors[0])


def test_an_undeclared_actor_fails_that_occurrence_only(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    broker = _broker(redis_url, namespace)
    occurrences = _occurrences(4)
    stray = Occurrence("sched", "stray", T0, "stray-id", freeze({"task": "nope"}), T0)
    try:
        errors = PipelinedDramatiqDispatcher(broker).dispatch_batch([*occurrences, stray])
        assert errors[:4] == [None] * 4 and "not declared" in str(errors[4])
        assert build_message(broker, occurrences[0]).queue_name == "qa"
    finally:
        broker.close()
    assert client.llen(f"{namespace}:qa") + client.llen(f"{namespace}:qb") == 4


# -- a real worker process --------------------------------------------------------------------

APP = textwrap.dedent("""
    import json
    import os

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import CurrentMessage

    env = os.environ
    seen = redis.Redis.from_url(env["BE_REDIS"])
    broker = RedisBroker(url=env["BE_REDIS"], namespace=env["BE_NAMESPACE"])
    broker.add_middleware(CurrentMessage())
    dramatiq.set_broker(broker)


    def record(*args, **kwargs):
        message = CurrentMessage.get_current_message()
        seen.rpush(env["BE_SEEN"], json.dumps({
            "id": message.message_id,
            "actor": message.actor_name,
            "queue": message.queue_name,
            "args": list(args),
            "kwargs": kwargs,
            "options": message.options,
        }))


    dramatiq.actor(record, actor_name="a", queue_name="qa", max_retries=0)
    dramatiq.actor(record, actor_name="b", queue_name="qb", max_retries=0)
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_process_consumes_a_batch_over_two_queues_once_each_as_sent(
    tmp_path: Path, client: redis.Redis, redis_url: str, prefix: str, namespace: str
) -> None:
    token = uuid.uuid4().hex[:8]
    module, seen_key = f"be_dramatiq_{token}", f"{prefix}:seen"
    (tmp_path / f"{module}.py").write_text(APP)
    queue, n = f"{prefix}-sched", 300
    repeat = Repeat(client, prefix)
    items = [
        (
            queue,
            f"r{i:04d}",
            define(
                every="1h",
                template={
                    "task": "ab"[i % 2],
                    "args": [i, "two"],
                    "kwargs": {"limit": i},
                    "options": {"max_retries": i % 3},
                },
            ),
        )
        for i in range(n)
    ]
    repeat.upsert_many(items, now_ms=T0)
    gate = Gate()
    broker = _broker(redis_url, namespace, gate)
    try:
        tick = Pump(repeat, [queue], PipelinedDramatiqDispatcher(broker), batch_size=n).run_once(
            now_ms=T0 + HOUR
        )
    finally:
        broker.close()
    assert len(tick.dispatched) == n and not tick.failed
    assert client.llen(f"{namespace}:qa") == client.llen(f"{namespace}:qb") == n // 2
    redis_ids = {
        json.loads(raw)["message_id"]: json.loads(raw)["options"]["redis_message_id"]
        for q in ("qa", "qb")
        for raw in client.hvals(f"{namespace}:{q}.msgs")
    }

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "BE_REDIS": redis_url,
        "BE_NAMESPACE": namespace,
        "BE_SEEN": seen_key,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "dramatiq", module, "--path", str(tmp_path)),
                *("--processes", "1", "--threads", "4", "--queues", "qa", "qb"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while client.llen(seen_key) < n:
            assert worker.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        time.sleep(1.0)  # room for a duplicate to show up, if there were one
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    output = log.read_text(errors="replace")
    assert "Traceback" not in output, output[-3000:]

    seen = [json.loads(raw) for raw in client.lrange(seen_key, 0, -1)]
    assert len(seen) == n
    by_i = {s["args"][0]: s for s in seen}
    assert sorted(by_i) == list(range(n))  # each once
    for i, s in by_i.items():
        actor = "ab"[i % 2]
        name = f"r{i:04d}"
        assert s["id"] == occurrence_id(prefix, queue, name, T0 + HOUR)
        assert (s["actor"], s["queue"]) == (actor, f"q{actor}")
        assert (s["args"], s["kwargs"]) == ([i, "two"], {"limit": i})
        options = s["options"]
        assert options["max_retries"] == i % 3
        assert (options["emq_name"], options["emq_due_ms"]) == (name, T0 + HOUR)
        assert options["redis_message_id"] == redis_ids[s["id"]]
    assert sorted(gate.before) == sorted(gate.after) == sorted(by_i[i]["id"] for i in range(n))
    assert client.hlen(f"{namespace}:qa.msgs") == client.hlen(f"{namespace}:qb.msgs") == 0  # acked


def test_a_broker_whose_dispatch_script_is_not_dramatiqs_keeps_broker_enqueue(
    redis_url: str, namespace: str
) -> None:
    broker = _broker(redis_url, namespace)
    try:
        assert can_pipeline(broker)
        own = "return redis.call('RPUSH', KEYS[1] .. ':' .. ARGV[3], ARGV[#ARGV])"
        broker.scripts["dispatch"] = broker.client.register_script(own)
        assert not can_pipeline(broker)
        assert type(dramatiq_dispatcher(broker)) is DramatiqDispatcher
    finally:
        broker.close()


@pytest.mark.parametrize(
    ("owner", "method", "mark"),
    [("encoder", "encode", b"GZ:"), ("message", "encode", b"SIG:")],
    ids=["JSONEncoder.encode", "Message.encode"],
)
def test_a_patched_encode_is_what_the_batch_writes(
    client: redis.Redis,
    redis_url: str,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    owner: str,
    method: str,
    mark: bytes,
) -> None:
    """A class-level patch of Dramatiq's encoding (one that compresses or signs every message)
    is what `broker.enqueue` writes: the batch writes it too, not its own JSON shortcut
    (probe: Dramatiq broker options, session 31)."""
    target: Any = dramatiq.encoder.JSONEncoder if owner == "encoder" else dramatiq.Message
    original = getattr(target, method)

    def marked(self: Any, *args: Any) -> bytes:
        return mark + bytes(original(self, *args))

    monkeypatch.setattr(target, method, marked)
    broker = _broker(redis_url, namespace)
    try:
        assert PipelinedDramatiqDispatcher(broker).dispatch_batch(_occurrences(3)) == [None] * 3
    finally:
        broker.close()
    stored = client.hvals(f"{namespace}:qa.msgs") + client.hvals(f"{namespace}:qb.msgs")
    assert len(stored) == 3
    assert all(data.startswith(mark) for data in stored), stored
