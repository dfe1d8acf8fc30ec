"""The shortcuts of the pipelined Celery path write what kombu and Celery write, and a
beat's tick holds the cyclic collector off."""

from __future__ import annotations

import gc
import math
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.utils import json as kombu_json

from emq_bridge.celery import PipelinedCeleryDispatcher, RepeatScheduler
from emq_bridge.celery.envelope import delivery_tags, fast_encoder
from emq_bridge.celery.pipelined import _body_encoder
from emq_bridge.template import freeze

dumps: Any = kombu_json.dumps  # untyped in kombu


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{prefix}-q",
        emq_bridge_prefix=prefix,
        result_backend=None,
        result_expires=None,
    )
    yield app
    app.close()


def test_delivery_tags_are_distinct_version_4_uuids_as_kombu_writes_them() -> None:
    tags = delivery_tags(2000)
    assert len(set(tags)) == 2000
    for tag in tags:
        parsed = uuid.UUID(tag)
        assert str(parsed) == tag
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert delivery_tags(0) == []


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.randrange(-(10**20), 10**20)
    if kind == 1:
        return rng.choice([0.1, -2.5e300, 1e-7, math.inf, -math.inf, math.nan, 3.0])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5):
        return "".join(rng.choice('aé"\\\n\x00\u2028😀 /') for _ in range(rng.randrange(8)))
    if kind in (6, 7):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(_value(rng, 3)): _value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_the_body_encoder_writes_exactly_what_kombus_dumps_writes() -> None:
    encode = fast_encoder(kombu_json.dumps)
    assert encode is not kombu_json.dumps
    rng = random.Random(7)
    for _ in range(2000):
        body = ([_value(rng) for _ in range(3)], {"k": _value(rng)}, {"chain": None})
        assert encode(body) == dumps(body)
        frozen = freeze({"args": body[0], "kwargs": body[1]})
        body = (frozen["args"], frozen["kwargs"], {})
        assert encode(body) == dumps(body)
    uuid_value = uuid.UUID(int=5)  # what kombu's `default` writes for types JSON lacks
    assert encode(([uuid_value], {}, {})) == dumps(([uuid_value], {}, {}))


def test_a_body_encoder_other_than_kombus_json_is_kept() -> None:
    def mine(value: Any) -> str:
        return "x"

    assert fast_encoder(mine) is mine


def test_the_base64_body_encoding_is_the_channels_own(app: Celery) -> None:
    dispatcher = PipelinedCeleryDispatcher(app)
    try:
        dispatcher._connect()
        channel = dispatcher._channel
        encode = _body_encoder(channel)
        for payload in ("", "[[1, 2], {}, {}]", "é😀\x00", b"\xff\x00raw"):
            assert encode(payload) == channel.encode_body(payload, channel.body_encoding)[0]
    finally:
        dispatcher.close()


def test_a_beat_tick_drains_with_the_cyclic_collector_held_off_and_gives_it_back(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = RepeatScheduler(app)
    assert scheduler.pump is not None
    step = scheduler.pump.step
    during: list[bool] = []

    def watched(stop: Any = None) -> Any:
        during.append(gc.isenabled())
        return step(stop)

    monkeypatch.setattr(scheduler.pump, "step", watched)
    try:
        assert gc.isenabled()
        scheduler.tick()
        assert during == [False] and gc.isenabled()
        gc.disable()  # a caller that turned it off keeps it off
        try:
            scheduler.tick()
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        scheduler.close()
