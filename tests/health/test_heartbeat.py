"""Pump heartbeats: written from the loop at most every few seconds, expiring on their own,
one key per queue on the queue's slot; from `Pump.run`, celery beat and Dramatiq's thread."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
import redis
from celery import Celery
from dramatiq.brokers.redis import RedisBroker
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from emq_bridge import Pump, Repeat
from emq_bridge.celery import RepeatScheduler
from emq_bridge.dramatiq import RecurringMiddleware, recurring
from emq_bridge.health import check, served, unserved
from emq_bridge.heartbeat import Heartbeat, heartbeat_ttl_ms
from emq_bridge.testing import RecordingDispatcher


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


def test_a_step_writes_the_heartbeat_and_the_next_ticks_within_the_interval_write_nothing(
    any_repeat: Repeat,
) -> None:
    pump = Pump(any_repeat, ["reports", "emails"], RecordingDispatcher())
    assert pump.heartbeat.ttl_ms == 30_000  # the default: a 5 s heartbeat, a 5 s sleep
    pump.step()
    [first] = any_repeat.pumps()
    before = any_repeat.pumps_by_queue(["reports", "emails"])
    assert first.queues == ("reports", "emails") and first.ticks == 1 and first.role == "pump"
    assert first.expires_ms == first.beat_ms + 30_000
    assert first.tick_ms is not None and first.tick_ms <= first.beat_ms
    for _ in range(5):
        pump.step()
    # Five more ticks, no write: the heartbeat costs nothing per tick.
    assert any_repeat.pumps_by_queue(["reports", "emails"]) == before
    assert [p.id for p in any_repeat.pumps(["reports", "emails"])] == [first.id]  # listed once
    assert pump.heartbeat.ticks == 6


def test_run_once_writes_no_heartbeat_and_run_removes_its_own_when_it_stops(
    any_repeat: Repeat,
) -> None:
    pump = Pump(any_repeat, ["reports"], RecordingDispatcher(), max_sleep_s=0.05)
    pump.run_once()
    assert any_repeat.pumps() == []
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,))
    thread.start()
    wait_until(lambda: len(any_repeat.pumps()) == 1, "a heartbeat")
    stop.set()
    thread.join(10)
    assert any_repeat.pumps() == []
    assert not any_repeat.client.exists(any_repeat.keys("reports").pumps)


def test_a_killed_pumps_heartbeat_expires_on_the_server_clock_and_the_key_has_no_ttl(
    repeat: Repeat,
) -> None:
    dead = Pump(repeat, ["reports"], RecordingDispatcher(), max_sleep_s=0.1)
    dead.heartbeat = Heartbeat(dead.queues, max_sleep_s=0.1, ttl_s=0.4)
    alive = Pump(repeat, ["reports"], RecordingDispatcher(), max_sleep_s=0.1)
    dead.step()
    alive.step()
    key = repeat.keys("reports").pumps
    # No TTL: under a volatile-* maxmemory policy the server evicts keys with one first.
    assert repeat.client.pttl(key) == -1
    assert {p.id for p in repeat.pumps()} == {dead.heartbeat.id, alive.heartbeat.id}
    time.sleep(0.5)  # `dead` never writes again, as if SIGKILLed
    assert [p.id for p in repeat.pumps()] == [alive.heartbeat.id]
    alive.heartbeat.write(repeat)  # any write drops the expired fields
    assert repeat.client.hkeys(key) == [alive.heartbeat.id.encode()]
    alive.heartbeat.remove(repeat)
    assert not repeat.client.exists(key)  # the last pump gone, the key goes


def test_a_heartbeat_drops_the_ttl_an_earlier_release_set_on_the_pump_table(
    repeat: Repeat,
) -> None:
    pump = Pump(repeat, ["reports"], RecordingDispatcher(), max_sleep_s=0.1)
    pump.step()
    key = repeat.keys("reports").pumps
    repeat.client.pexpire(key, 30_000)  # as the release before this one left it
    pump.heartbeat.write(repeat)
    assert repeat.client.pttl(key) == -1 and len(repeat.pumps()) == 1


def test_the_pump_table_is_on_the_queues_slot_and_outside_the_registration_names(
    repeat: Repeat,
) -> None:
    keys = repeat.keys("reports")
    assert key_slot(keys.pumps.encode()) == key_slot(keys.registry.encode())
    assert not keys.pumps.startswith(keys.registry + ":")


def test_a_heartbeat_edited_into_garbage_is_skipped_logged_and_dropped_by_the_next_write(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    key = repeat.keys("reports").pumps
    repeat.client.hset(key, mapping={"junk": "not a heartbeat", "old": "99999999999999 1 {}"})
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    with caplog.at_level(logging.ERROR, "emq_bridge"):
        assert repeat.pumps() == []
    assert "the heartbeat of pump junk is unreadable" in caplog.text
    assert "the heartbeat of pump old is unreadable" in caplog.text
    pump.step()
    assert sorted(repeat.client.hkeys(key)) == sorted([b"old", pump.heartbeat.id.encode()])
    assert [p.id for p in repeat.pumps()] == [pump.heartbeat.id]


def test_a_heartbeat_that_cannot_be_written_is_one_line_and_never_stops_the_pump(
    caplog: pytest.LogCaptureFixture, repeat: Repeat
) -> None:
    """Redis gone: one INFO line (the pump logs the outage itself, once). Redis refusing the
    write (here a `pumps` key of the wrong type): one WARNING, since the probes go blind."""
    no_retry = Retry(NoBackoff(), 0)
    dead = Repeat(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=no_retry))
    heartbeat = Heartbeat(["reports"], max_sleep_s=1.0)
    with caplog.at_level(logging.INFO, "emq_bridge"):
        assert heartbeat.write(dead) is False
        assert heartbeat.write(dead) is False
    lines = [r for r in caplog.records if "heartbeat could not be written" in r.message]
    assert [r.levelno for r in lines] == [logging.INFO]
    caplog.clear()
    repeat.client.set(repeat.keys("reports").pumps, "not a hash")
    refused = Heartbeat(["reports"], max_sleep_s=1.0)
    with caplog.at_level(logging.INFO, "emq_bridge"):
        assert refused.write(repeat) is False
        assert refused.write(repeat) is False
    lines = [r for r in caplog.records if "heartbeat could not be written" in r.message]
    assert [r.levelno for r in lines] == [logging.WARNING]


def test_the_ttl_covers_an_interval_and_a_sleep() -> None:
    assert heartbeat_ttl_ms(5.0, 5.0) == 30_000
    assert heartbeat_ttl_ms(5.0, 60.0) == 195_000  # a pump sleeping a minute between ticks
    with pytest.raises(ValueError, match="would expire while its pump sleeps"):
        Heartbeat(["q"], max_sleep_s=5.0, ttl_s=5.0)


def test_health_and_the_unserved_flag_read_the_heartbeats(repeat: Repeat) -> None:
    now_ms = repeat.server_time_ms()
    repeat.register(
        "reports", "digest", every="1m", template={"task": "t"}, now_ms=now_ms - 180_000
    )
    registration = repeat.get("reports", "digest")
    assert registration is not None
    assert served(repeat, ["reports"]) == set()
    assert unserved(registration, now_ms, set())
    assert not check(repeat, ["reports"]).ok
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    pump.heartbeat.write(repeat)
    assert served(repeat, ["reports", "other"]) == {"reports"}
    assert not unserved(registration, now_ms, {"reports"})
    repeat.pause("reports", "digest")
    paused = repeat.get("reports", "digest")
    assert paused is not None and not unserved(paused, now_ms, set())
    assert check(repeat, max_lag_ms=0).ok  # paused: nothing is overdue
    pump.heartbeat.remove(repeat)


def nothing() -> None:
    return None


def test_celery_beat_writes_its_heartbeat_as_celery_beat_and_removes_it_on_close(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    app = Celery(f"hb-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{prefix}-q",
        emq_bridge_prefix=prefix,
        beat_schedule={"tick": {"task": "t.tick", "schedule": 60.0}},
        result_backend=None,
        result_expires=None,
    )
    app.task(name="t.tick", shared=False)(nothing)
    scheduler = RepeatScheduler(app)
    try:
        scheduler.tick()
        [beat] = repeat.pumps()
        assert beat.role == "celery-beat" and beat.queues == (f"{prefix}-q",)
        assert check(repeat, [f"{prefix}-q"]).ok
    finally:
        scheduler.close()
        app.close()
    assert repeat.pumps() == []


def test_a_dramatiq_workers_pump_thread_writes_its_heartbeat_and_removes_it_when_it_stops(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dq")
    middleware = RecurringMiddleware(prefix=prefix, max_sleep_s=0.2)
    broker.add_middleware(middleware)

    @recurring(every="1h")
    @dramatiq.actor(broker=broker, queue_name=f"{prefix}-reports")
    def digest() -> None: ...

    middleware.boot(broker)
    pump: Any = middleware.start_pump(broker)
    try:
        wait_until(lambda: len(repeat.pumps()) == 1, "the pump thread's heartbeat")
        [worker] = repeat.pumps()
        assert worker.id == pump.heartbeat.id and worker.role == "dramatiq-worker"
        assert worker.queues == (f"{prefix}-reports",)
    finally:
        middleware.stop_pump()
        broker.close()
    assert repeat.pumps() == []


def test_pumps_of_a_prefix_holding_glob_characters_are_its_own_only(
    client: redis.Redis, prefix: str
) -> None:
    starred, plain = Repeat(client, f"{prefix}*"), Repeat(client, f"{prefix}x")
    Pump(plain, ["reports"], RecordingDispatcher()).step()
    assert starred.pump_queues() == [] and starred.pumps() == []
    pump = Pump(starred, ["reports"], RecordingDispatcher())
    pump.step()
    assert [p.id for p in starred.pumps()] == [pump.heartbeat.id]


@pytest.mark.parametrize("max_sleep_s", [0.5, 5.0, 10.0, 30.0])
@pytest.mark.parametrize("ttl_s", [1.0, 5.4, 6.0, 7.5, 14.9, 30.0])
def test_a_refused_heartbeat_life_names_the_least_one_that_is_accepted(
    max_sleep_s: float, ttl_s: float
) -> None:
    try:
        Heartbeat(["q"], max_sleep_s=max_sleep_s, ttl_s=ttl_s)
    except ValueError as exc:
        found = re.search(r"give more than ([0-9.]+)s", str(exc))
        assert found is not None, str(exc)
        least = float(found.group(1))
        with pytest.raises(ValueError):
            Heartbeat(["q"], max_sleep_s=max_sleep_s, ttl_s=least)
        Heartbeat(["q"], max_sleep_s=max_sleep_s, ttl_s=least + 0.001)  # just above: accepted


def test_the_pumps_table_cuts_a_long_queue_list_and_json_keeps_it_whole(
    repeat: Repeat, redis_url: str
) -> None:
    # Session 39's operations probe: a pump of 1,201 queues printed them all in its row.
    from click.testing import CliRunner

    from emq_bridge.cli import cli

    queues = [f"queue-{i:04d}" for i in range(1_201)]
    assert Heartbeat(queues, max_sleep_s=1.0).write(repeat)
    base = ["--redis-url", redis_url, "--prefix", repeat.prefix, "pumps"]
    table = CliRunner().invoke(cli, [*base, "queue-0000"], catch_exceptions=False)
    assert table.exit_code == 0, table.output
    [row] = table.stdout.splitlines()[1:]
    assert "queue-0000,queue-0001," in row and "(+1,196 more)" in row, row
    assert len(row) < 300, row
    whole = CliRunner().invoke(cli, [*base, "queue-0000", "--json"], catch_exceptions=False)
    assert json.loads(whole.stdout)[0]["queues"] == queues
