"""Heartbeats and the health check on a Redis Cluster: each queue's pump table is on its
queue's slot, on whichever master holds it, and `health` and `pumps` read them all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from faults.cluster import Cluster
from redis.crc import key_slot

from emq_bridge import Pump, Repeat
from emq_bridge.health import check, served
from emq_bridge.testing import RecordingDispatcher

pytestmark = pytest.mark.faults

QUEUES = [f"hq{i}" for i in range(12)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    built = Cluster().start()
    try:
        yield built
    finally:
        built.stop()


def test_heartbeats_and_health_work_across_the_masters_of_a_cluster(cluster: Cluster) -> None:
    client = cluster.client()
    repeat = Repeat(client, "health")
    for queue in QUEUES:
        repeat.register(queue, "job", every="1m", template={"task": "t"})
    masters = Counter(client.get_node_from_key(repeat.keys(q).pumps).name for q in QUEUES)
    assert len(masters) == 3, masters  # the pump tables are spread like the queues
    for queue in QUEUES:
        keys = repeat.keys(queue)
        assert key_slot(keys.pumps.encode()) == key_slot(keys.registry.encode())

    first = Pump(repeat, QUEUES[:6], RecordingDispatcher())
    first.step()
    assert repeat.pump_queues() == sorted(QUEUES[:6])  # found by SCAN on every master
    assert not check(repeat).ok
    assert check(repeat, QUEUES[:6]).ok
    second = Pump(repeat, QUEUES[6:], RecordingDispatcher())
    second.step()
    assert check(repeat).ok and served(repeat, QUEUES) == set(QUEUES)
    assert [p.id for p in repeat.pumps()] == sorted([first.heartbeat.id, second.heartbeat.id])
    first.heartbeat.remove(repeat)
    second.heartbeat.remove(repeat)
    assert repeat.pumps() == [] and repeat.pump_queues() == []
    repeat.close()
