"""A pump of many queues on a Redis Cluster: an idle tick is one round trip per master that
holds any of its queues, and the queues with work are drained wherever they live."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import RecordingDispatcher

from .cluster import Cluster

pytestmark = pytest.mark.faults

QUEUES = [f"q{i:03d}" for i in range(300)]
T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z, on the hour grid


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Socket writes of this process (a command or a pipeline: a round trip), by port."""
    counted: Counter[int] = Counter()
    send: Any = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        counted[self.port] += 1
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return counted


def test_an_idle_tick_is_one_round_trip_per_master_and_due_work_is_fired_on_each(
    cluster: Cluster, writes: Counter[int]
) -> None:
    client = cluster.client()
    repeat = Repeat(client, "trips")
    repeat.upsert_many(
        [(q, "hourly", define(every="1h", template={"task": q})) for q in QUEUES], now_ms=T0
    )
    masters = {cluster.master_of(repeat.keys(q).registry).port for q in QUEUES}
    assert len(masters) == 3
    recorder = RecordingDispatcher()
    pump = Pump(repeat, QUEUES, recorder)
    pump.run_once(now_ms=T0 + 1)  # the scripts are known to every master from here on

    writes.clear()
    tick = pump.run_once(now_ms=T0 + 2)

    assert dict(writes) == {port: 1 for port in masters}  # and no COMMAND GETKEYS per call
    assert tick.next_wake_ms == T0 + 3_600_000 and recorder.occurrences == []

    due = T0 + 3_600_000
    fired = pump.run_once(now_ms=due)
    assert sorted(o.queue for o in fired.dispatched) == QUEUES
    assert pump.run_once(now_ms=due).dispatched == []
    client.close()
