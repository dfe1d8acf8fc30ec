"""One pump serving 1,000 queues: an idle tick is one round trip, and the queues with work are
still drained, each on its own, their errors kept apart; wake-ups come on one subscription."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from emq_bridge import Pump, PumpEvents, RegistryError, Repeat, define
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z, on the hour grid
HOUR = 3_600_000
QUEUES = [f"q{i:04d}" for i in range(1000)]


class RoundTrips:
    """A client whose socket writes are counted: one per command or pipeline sent, as
    `bench/common.py` counts round trips."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.writes = 0
        counter = self
        pool = self.client.connection_pool
        base: Any = pool.connection_class

        class Counted(base):  # type: ignore[misc]
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                counter.writes += 1
                super().send_packed_command(command, check_health)

        pool.connection_class = Counted

    def during(self, action: Any) -> int:
        """Return how many round trips `action()` made."""
        before = self.writes
        action()
        return self.writes - before


@pytest.fixture
def counted(redis_url: str) -> Iterator[RoundTrips]:
    trips = RoundTrips(redis_url)
    yield trips
    trips.client.close()


def register_everywhere(repeat: Repeat, per_queue: int = 1) -> None:
    """Register `per_queue` hourly schedules in each of the 1,000 queues, first due T0 + 1 h."""
    repeat.upsert_many(
        [
            (queue, f"job-{i}", define(every="1h", template={"task": "t", "args": [queue, i]}))
            for queue in QUEUES
            for i in range(per_queue)
        ],
        now_ms=T0,
    )


def warm_up(repeat: Repeat) -> None:
    """Fire one occurrence on a queue of its own, so the server knows every script a
    drain runs (a first EVALSHA of each would cost two more round trips: NOSCRIPT, load)."""
    repeat.register("warm-up", "once", every="1m", template={}, now_ms=T0)
    Pump(repeat, ["warm-up"], RecordingDispatcher()).run_once(now_ms=T0 + 60_000)


def test_an_idle_tick_over_a_thousand_queues_is_one_round_trip(
    counted: RoundTrips, prefix: str
) -> None:
    repeat = Repeat(counted.client, prefix)
    register_everywhere(repeat, per_queue=10)
    recorder = RecordingDispatcher()
    many = Pump(repeat, QUEUES, recorder)
    one = Pump(repeat, QUEUES[:1], recorder)
    many.run_once(now_ms=T0 + 1)  # the scripts are known to the server from here on

    ticks: list[Any] = []
    trips_many = counted.during(lambda: ticks.append(many.run_once(now_ms=T0 + 2)))
    trips_one = counted.during(lambda: one.run_once(now_ms=T0 + 2))

    assert (trips_many, trips_one) == (1, 1)
    assert recorder.occurrences == []
    assert ticks[0].next_wake_ms == T0 + HOUR  # every queue's earliest score was read


def test_a_server_that_lost_the_scan_script_costs_a_reload_once_then_one_round_trip(
    counted: RoundTrips, prefix: str
) -> None:
    repeat = Repeat(counted.client, prefix)
    register_everywhere(repeat)
    pump = Pump(repeat, QUEUES, RecordingDispatcher())
    # What a restarted server or a promoted replica answers: NOSCRIPT, for every queue.
    repeat.scripts.scan.sha = "0" * 40

    first = counted.during(lambda: pump.run_once(now_ms=T0 + 1))
    second = counted.during(lambda: pump.run_once(now_ms=T0 + 1))

    assert (first, second) == (3, 1)  # the pipeline, SCRIPT LOAD, the pipeline again


def test_the_queues_with_due_work_among_a_thousand_are_drained_and_no_other(
    counted: RoundTrips, prefix: str
) -> None:
    repeat = Repeat(counted.client, prefix)
    register_everywhere(repeat)
    busy = ["q0000", "q0737", "q0999"]
    for queue in busy:
        repeat.register(queue, "now", every="1m", template={"task": queue}, now_ms=T0)
    warm_up(repeat)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, QUEUES, recorder)

    ticks: list[Any] = []
    trips = counted.during(lambda: ticks.append(pump.run_once(now_ms=T0 + 60_000)))

    assert sorted((o.queue, o.name) for o in recorder.occurrences) == [(q, "now") for q in busy]
    # One pipeline for every queue, then each busy queue: read records, claim, ack (and a
    # fresh scan when the drains before it took longer than `SCAN_FRESH_S`).
    assert 1 + 3 * len(busy) <= trips <= 1 + 4 * len(busy)
    assert ticks[0].next_wake_ms == T0 + 120_000
    assert all(repeat.leases(q) == [] for q in busy)
    assert pump.run_once(now_ms=T0 + 60_000).dispatched == []


def test_a_broken_queue_among_a_thousand_fails_alone(counted: RoundTrips, prefix: str) -> None:
    repeat = Repeat(counted.client, prefix)
    register_everywhere(repeat)
    for queue in ("q0010", "q0900"):
        repeat.register(queue, "now", every="1m", template={"task": queue}, now_ms=T0)
    for queue in ("q0500", "q0501"):  # keys of the wrong type: their scan fails
        registry = repeat.keys(queue).registry
        counted.client.delete(registry)
        counted.client.set(registry, "a string where a sorted set belongs")

    class Errors(PumpEvents):
        def __init__(self) -> None:
            self.queues: list[str] = []

        def on_queue_error(self, queue: str, error: BaseException) -> None:
            self.queues.append(queue)

    errors = Errors()
    recorder = RecordingDispatcher()
    pump = Pump(repeat, QUEUES, recorder, listeners=[errors])

    with pytest.raises(RegistryError, match="scan q0500: WRONGTYPE"):
        pump.run_once(now_ms=T0 + 60_000)  # the first broken queue's error

    assert sorted(o.queue for o in recorder.occurrences) == ["q0010", "q0900"]
    tick, delay = pump.step()  # as `run` does: each broken queue told once, the rest served
    assert tick is not None and delay <= 1.0
    assert errors.queues == ["q0500", "q0501"]


def test_a_queue_drained_after_a_slow_one_is_scanned_again_not_served_a_stale_scan(
    redis_url: str, prefix: str
) -> None:
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    two_hours_ago = repeat.server_time_ms() - 2 * HOUR
    repeat.register("slow", "a", every="1h", template={}, now_ms=two_hours_ago)
    repeat.register("late", "b", every="1h", template={}, now_ms=two_hours_ago)

    class Slow(RecordingDispatcher):
        def dispatch(self, occurrence: Any) -> None:
            super().dispatch(occurrence)
            if occurrence.queue == "slow":
                time.sleep(0.3)

    recorder = Slow()
    Pump(repeat, ["slow", "late"], recorder).run_once()  # the server's clock: both due

    by_queue = {o.queue: o for o in recorder.occurrences}
    # The claim of "late" ran at the server's time after the slow send, not at the tick's
    # first scan (`released_ms` is the claim's now).
    assert by_queue["late"].released_ms - by_queue["slow"].released_ms >= 300


def test_a_pump_of_a_thousand_queues_wakes_on_one_subscription_for_the_last_queue(
    redis_url: str, prefix: str
) -> None:
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    register_everywhere(repeat)  # nothing due before 2030
    recorder = RecordingDispatcher()
    ticked = threading.Event()

    class Ticks(PumpEvents):
        def on_tick(self, tick: Any) -> None:
            ticked.set()

    pump = Pump(repeat, QUEUES, recorder, max_sleep_s=120, listeners=[Ticks()])
    watcher = redis.Redis.from_url(redis_url)
    channels = {repeat.keys(q).wake_channel for q in QUEUES}
    thread = threading.Thread(target=pump.run)
    thread.start()
    try:
        assert ticked.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all_subscribed(watcher, channels):
            time.sleep(0.05)
        numsub = dict(watcher.pubsub_numsub(*channels))
        assert set(numsub.values()) == {1}  # every queue's channel, by one subscriber...
        subscribers = [c for c in watcher.client_list() if int(c.get("sub", 0)) > 0]
        mine = [c for c in subscribers if int(c["sub"]) >= len(QUEUES)]
        assert len(mine) == 1 and int(mine[0]["sub"]) == len(QUEUES)  # ...one connection
        ticked.clear()
        time.sleep(0.3)  # asleep: the next tick would be in 120 s without a wake-up
        repeat.register("q0999", "soon", every="1s", template={"task": "soon"})
        deadline = time.monotonic() + 30
        while "soon" not in recorder.names() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "soon" in recorder.names()
    finally:
        pump.stop()
        thread.join(10)
        watcher.close()
    assert not thread.is_alive()


def all_subscribed(client: redis.Redis, channels: set[str]) -> bool:
    return all(count >= 1 for _, count in client.pubsub_numsub(*channels))


def test_a_health_check_over_a_thousand_queues_is_four_round_trips(
    counted: RoundTrips, prefix: str
) -> None:
    """The earliest run of every queue in one pipeline, their pumps in another, the server's
    clock, its maxmemory-policy (named when it evicts: session 28): as many round trips for
    1,000 queues as for one. A broken queue fails the check with its own error."""
    from emq_bridge import health

    repeat = Repeat(counted.client, prefix)
    register_everywhere(repeat)
    Pump(repeat, QUEUES, RecordingDispatcher()).step()  # a pump lives: its heartbeat
    health.check(repeat, QUEUES)  # the scan script is known to the server from here on

    results: list[health.Health] = []
    trips = counted.during(lambda: results.append(health.check(repeat, QUEUES)))

    assert trips == 4
    (result,) = results
    assert result.ok, result.reason
    assert len(result.queues) == 1000
    assert {item.queue for item in result.queues if item.pumps} == set(QUEUES)
    registry = repeat.keys("q0500").registry
    counted.client.delete(registry)
    counted.client.set(registry, "a string where a sorted set belongs")
    with pytest.raises(RegistryError, match="scan q0500: WRONGTYPE"):
        health.check(repeat, QUEUES)
