"""Through Redis Cluster, also while the queue's slot is MIGRATING: a claim drops the queued
backfilled slots a schedule changed since can no longer have (their record and ledger keys
named in the script from the registry key, same hash tag) and sends the others."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import redis

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import RecordingDispatcher

from .cluster import Cluster
from .test_cluster_migrating_slot_s26 import migrating

pytestmark = pytest.mark.faults

H = 3_600_000
T0 = int(datetime(2030, 1, 1, 12, tzinfo=timezone.utc).timestamp() * 1000)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[redis.cluster.RedisCluster]:
    made = cluster.client()
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("slot_migrating", [False, True], ids=["stable", "migrating"])
def test_a_claim_through_a_cluster_drops_the_queued_slots_outside_the_new_bounds(
    cluster: Cluster, client: redis.cluster.RedisCluster, slot_migrating: bool
) -> None:
    queue = f"bf-{slot_migrating}"
    repeat = Repeat(client, "s27")
    hourly = {"every": "1h", "misfire": "skip", "template": {"task": "t"}}
    repeat.upsert(queue, "n", definition=define(**hourly), now_ms=T0)
    repeat.backfill(queue, "n", T0 - 4 * H, T0 - H, rate=0, now_ms=T0)
    later = datetime.fromtimestamp((T0 - 2 * H) / 1000, timezone.utc)
    repeat.upsert(queue, "n", definition=define(**hourly, start_at=later), now_ms=T0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, [queue], recorder)
    if slot_migrating:
        # Every key scan and the claim name must exist, for the source to run them (as in
        # test_cluster_migrating_slot_s26): `running` gets an occurrence in flight.
        client.zadd(repeat.keys(queue).running, {"other 0": 2 * T0})
        with migrating(cluster, repeat.keys(queue).registry):
            pump.run_once(T0 + 1000)
    else:
        pump.run_once(T0 + 1000)
    assert sorted((o.due_ms - T0) // H for o in recorder.occurrences) == [-2, -1]
    ledger = client.zrange(repeat.keys(queue).backfilled("n"), 0, -1)
    assert sorted((int(m) - T0) // H for m in ledger) == [-2, -1]
