"""The parts of `RedisBroker.enqueue` (Dramatiq 2.x) that `PipelinedDramatiqDispatcher` does
for a whole batch: the message's Redis id, its encoding, the enqueue hooks and the writes.

Part of `emq_bridge.dramatiq`. Each reproduces a Dramatiq internal that is not public API,
named where it is used; the tests compare what they produce with what `broker.enqueue`
produces, on the Dramatiq the project runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import dramatiq
from dramatiq.common import current_millis
from dramatiq.encoder import JSONEncoder
from dramatiq.middleware import Middleware, MiddlewareError

from ..scripts import lua_source

__all__ = [
    "EnqueueScript",
    "encoder",
    "enqueue_hook",
    "redis_message_id",
    "redis_message_ids",
    "writes_as_dispatch_lua",
]


def redis_message_id() -> str:
    """Return a fresh `redis_message_id`: what `enqueue` takes, `str(uuid.uuid4())`."""
    return str(uuid.uuid4())


# The bits `uuid.UUID(version=4)` sets: the version nibble and the RFC 4122 variant.
_VERSION_4_KEEP = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_4_SET = (0x4000 << 64) | (0x8000 << 48)


def redis_message_ids(count: int) -> list[str]:
    """Return `count` fresh `redis_message_id`s, each what `str(uuid.uuid4())` makes, from one
    `os.urandom` call: a uuid4 each costs a system call and a `UUID` built in Python, a
    share of a pipelined message's cost that shows."""
    random = os.urandom(16 * count)
    out = []
    for start in range(0, 16 * count, 16):
        value = int.from_bytes(random[start : start + 16], "big") & _VERSION_4_KEEP | _VERSION_4_SET
        h = f"{value:032x}"
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out


# `Message.encode` under Dramatiq's default encoder is `json.dumps(message.asdict(),
# separators=(",", ":"))`: one encoder with those settings gives the same text without a
# `JSONEncoder` built per call, and the fields read by name skip `dataclasses.fields`.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
_MESSAGE_FIELDS = (
    "queue_name",
    "actor_name",
    "args",
    "kwargs",
    "options",
    "message_id",
    "message_timestamp",
)
_KNOWN_FIELDS = tuple(f.name for f in dataclasses.fields(dramatiq.Message)) == _MESSAGE_FIELDS


def _encode_json(message: dramatiq.Message[Any]) -> bytes:
    return _COMPACT_JSON.encode(
        {
            "queue_name": message.queue_name,
            "actor_name": message.actor_name,
            "args": message.args,
            "kwargs": message.kwargs,
            "options": message.options,
            "message_id": message.message_id,
            "message_timestamp": message.message_timestamp,
        }
    ).encode("utf-8")


def _encode_any(message: dramatiq.Message[Any]) -> bytes:
    return message.encode()


def encoder() -> Callable[[dramatiq.Message[Any]], bytes]:
    """Return what encodes a message to the bytes `message.encode()` gives now.

    The shortcut only under Dramatiq's own `JSONEncoder` (the global one, as `encode` reads
    it) and the `Message` fields it knows, with their methods Dramatiq's own (none replaced
    on the class or the instance: a patch that compresses or signs every message);
    `message.encode()` under anything else.
    """
    current = dramatiq.get_encoder()
    if type(current) is JSONEncoder and _KNOWN_FIELDS and "encode" not in vars(current):
        own = (
            (JSONEncoder.encode, "dramatiq.encoder"),
            (dramatiq.Message.encode, "dramatiq.message"),
            (dramatiq.Message.asdict, "dramatiq.message"),
        )
        if all(getattr(method, "__module__", None) == module for method, module in own):
            return _encode_json
    return _encode_any


def enqueue_hook(
    broker: dramatiq.Broker, when: Literal["before", "after"]
) -> Callable[[dramatiq.Message[Any], None], None] | None:
    """Return what `broker.emit_<when>("enqueue", message, delay)` does, taking (message,
    delay), or None when it would do nothing.

    When the broker's emit method is Dramatiq's own (`Broker.emit_before`/`emit_after`), it
    calls each middleware's hook in turn (`emit_after` in reverse order), logs what a hook
    raises and goes on, except that a `MiddlewareError` from a `before_` hook propagates:
    the same, calling only the middleware that have their own hook (`Middleware`'s are
    empty), looked up once a batch instead of per message. Any other emit method is called
    as it is.
    """
    emit_name, hook_name = f"emit_{when}", f"{when}_enqueue"
    if getattr(type(broker), emit_name) is not getattr(dramatiq.Broker, emit_name) or (
        emit_name in vars(broker)
    ):
        emit: Callable[..., None] = getattr(broker, emit_name)
        return partial(emit, "enqueue")
    empty = getattr(Middleware, hook_name)
    middleware = broker.middleware if when == "before" else list(reversed(broker.middleware))
    hooks = [
        (m, hook)
        for m in middleware
        if getattr(hook := getattr(m, hook_name), "__func__", None) is not empty
    ]
    if not hooks:
        return None
    reraise = MiddlewareError if when == "before" else ()

    def run(message: dramatiq.Message[Any], delay: None) -> None:
        for m, hook in hooks:
            try:
                hook(broker, message, delay)
            except reraise:
                raise
            except Exception:
                broker.logger.critical(
                    "Unexpected failure in %s of %r.", hook_name, m, exc_info=True
                )

    return run


# The lines of Dramatiq's `dispatch.lua` (2.x) whose writes `dramatiq_enqueue.lua` makes: the
# key names, the heartbeat every call writes and the `enqueue` command.
_REPRODUCED = (
    'local heartbeats = namespace .. ":__heartbeats__"',
    'redis.call("zadd", heartbeats, timestamp, worker_id)',
    'local queue_full_name = namespace .. ":" .. queue_name',
    'local queue_messages = queue_full_name .. ".msgs"',
    'if command == "enqueue" then',
    "local message_id = ARGS[1]",
    "local message_data = ARGS[2]",
    'redis.call("hset", queue_messages, message_id, message_data)',
    'redis.call("rpush", queue_full_name, message_id)',
)


def writes_as_dispatch_lua(broker: dramatiq.Broker) -> bool:
    """Say whether the broker's `dispatch` script (`broker.scripts["dispatch"]`, the source
    it registered) has the lines `dramatiq_enqueue.lua` reproduces, so that its writes are
    what that script's `enqueue` would write. A Dramatiq that changed them, or a script of
    the broker's own, keeps `broker.enqueue`.
    """
    scripts = getattr(broker, "scripts", None)
    source = getattr(scripts.get("dispatch"), "script", None) if isinstance(scripts, dict) else None
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    return isinstance(source, str) and all(line in source for line in _REPRODUCED)


class EnqueueScript:
    """`lua/dramatiq_enqueue.lua` on a broker's client: the writes of the `enqueue` command
    of Dramatiq's `dispatch` script, for groups of messages, in one call.

    It reads `broker.namespace`, `broker.broker_id` and `broker.client` (the keys and the
    heartbeat member `dispatch.lua` derives from them).
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.script = broker.client.register_script(lua_source("dramatiq_enqueue"))

    def write(self, groups: Sequence[tuple[str, Sequence[tuple[str, bytes]]]]) -> list[str | None]:
        """Write `groups` ((queue name, [(redis message id, encoded message), ...]), ...).

        Return, per group, None once its messages are in, or the error of its writes; raise
        what the client raises when the call itself fails (nothing of it is known to be in).
        """
        broker = self.broker
        args: list[Any] = [current_millis(), broker.broker_id]
        for queue, messages in groups:
            args += (queue, len(messages))
            for pair in messages:
                args += pair
        replies = self.script(keys=[broker.namespace], args=args, client=broker.client)
        return [None if reply == 0 else _text(reply) for reply in replies]


def _text(reply: Any) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
