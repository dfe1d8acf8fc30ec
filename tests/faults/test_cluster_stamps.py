"""Sync stamps on a Redis Cluster: each queue's stamps and counters sit on its queue's slot,
on whichever master holds it; a stamp holds, and breaks, across the masters."""

from __future__ import annotations

from collections import Counter

import pytest
from redis.crc import key_slot

from emq_bridge import Declaration, Repeat, define
from emq_bridge.sync import Stamp, stamped, sync
from faults.cluster import Cluster

pytestmark = pytest.mark.faults

QUEUES = [f"sq{i}" for i in range(12)]


def test_a_stamp_holds_and_breaks_across_the_masters_of_a_cluster(cluster: Cluster) -> None:
    client = cluster.client()
    repeat = Repeat(client, "stamps")
    declared = [
        Declaration(q, "job", define(every="1m", template={"task": "t", "args": [i]}))
        for i, q in enumerate(QUEUES)
    ]
    stamp = Stamp("f1", {"declared": len(declared)})

    sync(repeat, declared, "app", stamp=stamp)

    masters = Counter(client.get_node_from_key(repeat.keys(q).synced).name for q in QUEUES)
    assert len(masters) == 3, masters
    for queue in QUEUES:
        keys = repeat.keys(queue)
        assert key_slot(keys.synced.encode()) == key_slot(keys.registry.encode())
    assert stamped(repeat, "app", "f1") == {"declared": 12}
    repeat.cancel(QUEUES[7], "job")  # one queue, on one master
    assert stamped(repeat, "app", "f1") is None
    plan = sync(repeat, declared, "app", stamp=stamp)
    assert [(d.queue, d.name) for d in plan.create] == [(QUEUES[7], "job")]
    assert stamped(repeat, "app", "f1") == {"declared": 12}
    repeat.close()


def test_a_clusters_identity_is_its_primaries_and_holds_between_reads(cluster: Cluster) -> None:
    """What a sync compares to tell a registry restarted under it (`Repeat.server_identity`,
    session 31): on a cluster, every primary's run_id, the same from one read to the next."""
    repeat = Repeat(cluster.client(), "identity")
    first = repeat.server_identity()
    assert first is not None and len(first.split()) == cluster.masters
    assert repeat.server_identity() == first
