"""A registry edited by hand into a corrupt state: the pump parks the broken registration
with a clear error log and keeps serving the others; a broken queue does not stop the
other queues of the same pump.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
import redis

from emq_bridge import Pump, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.pump import CORRUPT_PARK_MS
from emq_bridge.testing import RecordingDispatcher

pytestmark = pytest.mark.faults

Corruption = Callable[[redis.Redis, str], None]


def hset(field: str, value: str) -> Corruption:
    return lambda client, key: client.hset(key, field, value) and None


def hdel(field: str) -> Corruption:
    return lambda client, key: client.hdel(key, field) and None


def replace_with_string(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.set(key, "not a hash")


def delete(client: redis.Redis, key: str) -> None:
    client.delete(key)


PARKED: dict[str, Corruption] = {
    "missing template": hdel("template"),
    "missing cadence": hdel("every_ms"),
    "every_ms not a number": hset("every_ms", "soon"),
    "every_ms zero": hset("every_ms", "0"),
    "every_ms negative": hset("every_ms", "-1000"),
    "every_ms a float": hset("every_ms", "1e3"),
    "template not json": hset("template", "{oops"),
    "template a list": hset("template", "[1, 2]"),
    "template with NaN": hset("template", '{"x": NaN}'),
    "template nested too deep": hset("template", "[" * 100_000 + "]" * 100_000),
    "misfire unknown": hset("misfire", "sometimes"),
    "anchor unknown": hset("anchor", "moon"),
    "cron garbage": hset("cron", "every full moon"),
    "cron never fires": hset("cron", "0 0 31 2 *"),
    "time zone unknown": hset("cron", "0 * * * *") or hset("tz", "Mars/Olympus_Mons"),
    "orphan member": delete,
    "record of the wrong type": replace_with_string,
}


def corrupt_tz(client: redis.Redis, key: str) -> None:
    client.hset(key, mapping={"cron": "0 * * * *", "tz": "Mars/Olympus_Mons"})


PARKED["time zone unknown"] = corrupt_tz


@pytest.mark.parametrize("corruption", list(PARKED), ids=list(PARKED))
def test_a_corrupt_registration_is_parked_with_an_error_and_the_others_still_fire(
    own_client: redis.Redis, corruption: str, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Repeat(own_client, "cr")
    for name in ("alpha", "broken", "omega"):
        repeat.register("q", name, every_ms=1_000, template={"task": name}, now_ms=0)
    PARKED[corruption](own_client, repeat.keys("q").record("broken"))
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)

    tick = pump.run_once(now_ms=1_000)

    assert sorted(dispatcher.names()) == ["alpha", "omega"]
    assert tick.parked == ["broken"]
    assert own_client.zscore(repeat.keys("q").registry, "broken") == 1_000 + CORRUPT_PARK_MS
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "q/broken" in errors[0], errors
    # Parked, not lost: it is looked at again after the park, and the others go on.
    dispatcher.clear()
    pump.run_once(now_ms=2_000)
    assert sorted(dispatcher.names()) == ["alpha", "omega"]


@pytest.mark.parametrize("score", [1_500.5, "-inf"], ids=["a fraction", "minus infinity"])
def test_a_score_edited_by_hand_is_fired_once_instead_of_staying_due_forever(
    own_client: redis.Redis, score: float | str
) -> None:
    repeat = Repeat(own_client, "cr")
    for name in ("edited", "healthy"):
        repeat.register("q", name, every_ms=1_000, template={}, now_ms=0)
    own_client.zadd(repeat.keys("q").registry, {"edited": score})
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)

    tick = pump.run_once(now_ms=2_000)

    assert sorted(dispatcher.names()) == ["edited", "healthy"]
    assert tick.next_wake_ms is not None and tick.next_wake_ms > 2_000  # no busy loop
    assert pump.run_once(now_ms=2_000).dispatched == []


@pytest.mark.parametrize("field", ["fired", "missed"])
def test_a_counter_edited_into_a_non_integer_restarts_instead_of_failing_the_claim(
    own_client: redis.Redis, field: str
) -> None:
    repeat = Repeat(own_client, "cr")
    for name in ("a-broken", "b-healthy"):
        repeat.register("q", name, every_ms=1_000, template={}, now_ms=0)
    own_client.hset(repeat.keys("q").record("a-broken"), field, "many")
    dispatcher = RecordingDispatcher()

    Pump(repeat, ["q"], dispatcher).run_once(now_ms=5_500)

    assert sorted(dispatcher.names()) == ["a-broken", "b-healthy"]
    registration = repeat.get("q", "a-broken")
    assert registration is not None
    assert (registration.fired, registration.missed) == (1, 4)


def test_a_running_pump_keeps_serving_a_queue_whose_neighbour_is_broken_and_logs_it_once(
    own_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Repeat(own_client, "cr")
    repeat.register("healthy", "beat", every_ms=100, template={})
    repeat.register("broken", "beat", every_ms=100, template={})
    registry = repeat.keys("broken").registry
    own_client.delete(registry)
    own_client.set(registry, "a string where a sorted set belongs")
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["broken", "healthy"], dispatcher, max_sleep_s=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while len(dispatcher.names()) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(5)

    assert not thread.is_alive()
    assert len(dispatcher.names()) >= 10
    assert {o.queue for o in dispatcher.occurrences} == {"healthy"}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("broken:"), errors


@pytest.mark.parametrize("member", ["garbage", "alpha soon", "", "alpha 1.5"])
def test_a_lease_edited_into_garbage_is_dropped_with_an_error_and_the_others_still_fire(
    own_client: redis.Redis, member: str, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Repeat(own_client, "cr")
    for name in ("alpha", "omega"):
        repeat.register("q", name, every_ms=1_000, template={}, now_ms=0)
    own_client.zadd(repeat.keys("q").leases, {member: 0})
    assert repeat.leases("q") == []  # a read skips it
    dispatcher = RecordingDispatcher()

    Pump(repeat, ["q"], dispatcher).run_once(now_ms=1_000)

    assert sorted(dispatcher.names()) == ["alpha", "omega"]
    assert own_client.zcard(repeat.keys("q").leases) == 0  # the pump dropped it
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.name == "emq_bridge.pump" and r.levelno >= logging.ERROR
    ]
    assert len(errors) == 1 and "lease" in errors[0], errors


def celery_beat_noop() -> None:
    """The task the beat sends (never run here)."""


def test_celery_beat_keeps_sending_when_a_neighbour_queue_is_broken(
    own_server: EmbeddedServer, own_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import Celery

    from emq_bridge.celery import RepeatScheduler

    app = Celery("broken", broker=own_server.url, set_as_current=False)
    app.conf.update(
        task_default_queue="healthy",
        beat_schedule={
            "a": {"task": "t.noop", "schedule": 0.2, "options": {"queue": "broken"}},
            "b": {"task": "t.noop", "schedule": 0.2},
        },
        result_backend=None,
        result_expires=None,
    )
    app.task(name="t.noop", shared=False)(celery_beat_noop)
    scheduler = RepeatScheduler(app)
    registry = Repeat(own_client, "emq").keys("broken").registry
    own_client.delete(registry)
    own_client.set(registry, "a string where a sorted set belongs")
    try:
        deadline = time.monotonic() + 10
        while own_client.llen("healthy") < 3 and time.monotonic() < deadline:
            time.sleep(min(scheduler.tick(), 0.2))
    finally:
        scheduler.close()
        app.close()
    assert own_client.llen("healthy") >= 3
    errors = [
        r for r in caplog.records if r.name.startswith("emq_bridge") and r.levelno >= logging.ERROR
    ]
    assert 1 <= len(errors) <= 2, [r.getMessage() for r in errors]
