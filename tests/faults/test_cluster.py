"""Redis Cluster: 3 masters with one replica each, built from the embedded server binary.

Registries of many queues spread over every master (each queue's keys share one slot,
through its `{q}` hash tag); register, upsert, claim, ack, pause, resume, trigger and
cancel run through redis-py's `RedisCluster`; a running pump rides out a master failover.

What survives a failover leans on one guarantee: replication is asynchronous, so a write
survives the loss of its master once the replica has acknowledged it, which is what
`WAIT 1 <timeout>` reports. The test takes that barrier (`Cluster.replicated`) after the
registrations, kills the master, and finds every one of them on the promoted replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from redis.crc import key_slot

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import RecordingDispatcher

from .cluster import Cluster, wait_for

pytestmark = pytest.mark.faults

QUEUES = [f"q{i}" for i in range(60)]
PER_QUEUE = 5


def test_many_queues_spread_over_all_masters_and_every_move_works_through_redis_cluster(
    cluster: Cluster,
) -> None:
    client = cluster.client()
    repeat = Repeat(client, "moves")
    definition = define(every_ms=1_000, template={"task": "t"})
    items = [(q, f"r{i}", definition) for q in QUEUES for i in range(PER_QUEUE)]
    assert set(repeat.upsert_many(items, now_ms=0)) == {"created"}
    assert set(repeat.upsert_many(items, now_ms=0)) == {"unchanged"}
    assert repeat.register("q0", "r0", every_ms=1_000, now_ms=0) == "exists"

    masters = Counter(client.get_node_from_key(repeat.keys(q).registry).name for q in QUEUES)
    assert len(masters) == 3, masters
    for queue in QUEUES:
        keys = repeat.keys(queue)
        slots = {key_slot(k.encode()) for k in keys.all_keys(("r0", "r4"))}
        assert len(slots) == 1
    assert repeat.queues() == sorted(QUEUES)

    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, QUEUES, dispatcher, lease_ms=5_000)
    tick = pump.run_once(now_ms=1_000)
    assert len(tick.dispatched) == len(items)
    assert all(repeat.leases(q) == [] for q in QUEUES)  # acked on every shard
    assert {r.next_run_ms for q in QUEUES for r in repeat.list(q)} == {2_000}

    class Refusing:
        def dispatch(self, occurrence: object) -> None:
            raise ConnectionError("broker down")

    Pump(repeat, ["q1"], Refusing(), lease_ms=5_000).run_once(now_ms=2_000)
    assert len(repeat.leases("q1")) == PER_QUEUE
    dispatcher.clear()
    pump.run_once(now_ms=7_000)  # the leases expired: re-dispatched with the same ids
    redelivered = [o for o in dispatcher.occurrences if o.redelivered]
    assert sorted(o.name for o in redelivered) == [f"r{i}" for i in range(PER_QUEUE)]

    assert repeat.pause("q2", "r0")
    assert repeat.resume("q2", "r0", now_ms=10_000)
    occurrence_id = repeat.trigger("q3", "r0", now_ms=10_000)
    dispatcher.clear()
    pump.run_once(now_ms=10_000)
    assert occurrence_id in {o.id for o in dispatcher.occurrences}
    assert repeat.cancel("q4", "r0")
    assert repeat.get("q4", "r0") is None
    assert pump.check_eviction_policy() == "noeviction"
    client.close()


def test_a_policy_that_evicts_on_one_master_is_reported_for_the_cluster(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    client = cluster.client()
    one_master = client.get_primaries()[-1]
    client.config_set("maxmemory-policy", "allkeys-lru", target_nodes=one_master)
    try:
        pump = Pump(Repeat(client, "ev"), ["q"], RecordingDispatcher())
        assert pump.check_eviction_policy() == "allkeys-lru"
        assert "allkeys-lru" in caplog.text
    finally:
        client.config_set("maxmemory-policy", "noeviction", target_nodes=one_master)
        client.close()


def test_a_master_failover_loses_no_registration_the_replica_acknowledged_and_the_pump_resumes(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, report: Callable[[str], None]
) -> None:
    caplog.set_level(logging.INFO, logger="emq_bridge")
    client = cluster.client()
    repeat = Repeat(client, "failover")
    definition = define(every_ms=500, template={"task": "t"})
    items = [(q, f"r{i}", definition) for q in QUEUES for i in range(PER_QUEUE)]
    assert set(repeat.upsert_many(items)) == {"created"}
    victim_queue = "q0"
    victim = cluster.master_of(repeat.keys(victim_queue).registry)
    assert cluster.replicated(victim) == 1, "the replica did not acknowledge the registrations"

    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, QUEUES, dispatcher, lease_ms=2_000, max_sleep_s=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: victim_queue in {o.queue for o in dispatcher.occurrences}, 20, "a first tick"
        )
        killed_at = time.monotonic()
        promoted = cluster.kill_and_fail_over(victim)
        failed_over_s = time.monotonic() - killed_at
        dispatcher.clear()
        wait_for(
            lambda: victim_queue in {o.queue for o in dispatcher.occurrences},
            30,
            "pumping on the new master",
        )
        resumed_s = time.monotonic() - killed_at
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(15)

    assert cluster.master_of(repeat.keys(victim_queue).registry) is promoted
    fresh = Repeat(cluster.client(), "failover")
    for queue in QUEUES:
        assert sorted(r.name for r in fresh.list(queue)) == [f"r{i}" for i in range(PER_QUEUE)], (
            queue
        )
    assert fresh.register(victim_queue, "after-failover", every_ms=1_000) == "registered"
    assert fresh.cancel(victim_queue, "after-failover")
    outage_logs = [
        r for r in caplog.records if "unreachable" in r.getMessage() or "failed" in r.getMessage()
    ]
    assert len(outage_logs) <= 2 * len(QUEUES), "the outage was logged per tick"
    report(
        f"\ncluster failover: replica promoted {failed_over_s:.1f}s after the master was killed; "
        f"the pump fired the failed-over queues again {resumed_s:.1f}s after; "
        f"{len(items)} registrations on 3 shards, none lost; {len(outage_logs)} outage log lines"
    )
