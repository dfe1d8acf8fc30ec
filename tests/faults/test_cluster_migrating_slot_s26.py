"""A queue's slot MIGRATING (a reshard under way, its keys still on the source) loses nothing.

Found by a probe: while a slot is MIGRATING, a script that empties a key (its last member
removed) and then touches that key again fails there ("Attempted to access a non local key
in a cluster node script": the server takes a missing key for one moved away), and the
writes made before it stay. A claim that served a queue's only pending trigger, then wrote
its leases, moved the score and consumed the trigger but leased and sent nothing: the due
slot and the trigger were lost. An ack that dropped the last lease failed on its last read,
applied but told failed. A final report or a loss that emptied `running` lost the buffered
slot it was releasing. A pump that stopped, the last of its queue, failed to remove its
heartbeat. Every script now leaves a key alone once it may have emptied it.

Each test sets its queue's slot MIGRATING on its master and IMPORTING on another one (no
key moved), runs the moves through the public API, and puts the slot back afterwards.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from emq_bridge import ListPushDispatcher, Pump, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.heartbeat import Heartbeat
from emq_bridge.lifecycle import report_of

from .cluster import Cluster

pytestmark = pytest.mark.faults


@pytest.fixture
def client(cluster: Cluster) -> Iterator[redis.cluster.RedisCluster]:
    made = cluster.client()
    try:
        yield made
    finally:
        made.close()


@contextlib.contextmanager
def migrating(cluster: Cluster, key: str) -> Iterator[None]:
    """Hold the slot of `key` MIGRATING on its master, IMPORTING on another master, with
    every key still on the source (CLUSTER SETSLOT, no MIGRATE); then give it back to its
    owner: SETSLOT ... STABLE on both (SETSLOT ... NODE <owner> leaves a source that holds
    keys MIGRATING, and a target given the slot of another node IMPORTING)."""
    slot = key_slot(key.encode())
    source = cluster.master_of(key)
    target = next(n for n in cluster.nodes if n is not source and _is_master(cluster, n))
    with cluster.admin(source) as src, cluster.admin(target) as dst:
        source_id, target_id = src.cluster("myid"), dst.cluster("myid")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        try:
            yield
        finally:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            src.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def _is_master(cluster: Cluster, node: EmbeddedServer) -> bool:
    if node.process is None:
        return False
    with cluster.admin(node) as admin:
        return bool(admin.info("replication")["role"] == "master")


def target_of(client: redis.cluster.RedisCluster, queue: str) -> ListPushDispatcher:
    """The raw list target of `queue`'s test, its list on another slot than the queue's."""
    return ListPushDispatcher(client, out_key(queue))


def out_key(queue: str) -> str:
    return f"{{s26-out}}:{queue}"


def sent(client: redis.cluster.RedisCluster, queue: str) -> list[tuple[str, int, bool]]:
    """Pop what the list target received for `queue`: (name, due_ms, triggered), in order."""
    out = []
    while client.llen(out_key(queue)):
        message = message_of(client, queue)
        out.append((str(message["name"]), int(message["due_ms"]), bool(message["triggered"])))
    return out


def message_of(client: redis.cluster.RedisCluster, queue: str) -> dict[str, Any]:
    """Pop the oldest message the list target received for `queue`."""
    raw = client.lpop(out_key(queue))
    assert isinstance(raw, bytes), "nothing was sent"
    return dict(json.loads(raw))


def errors_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_claim_that_serves_the_only_pending_trigger_and_its_ack_lose_nothing_mid_migration(
    cluster: Cluster, client: redis.cluster.RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    queue = "claim"
    repeat = Repeat(client, "s26")
    keys = repeat.keys(queue)
    assert key_slot(out_key(queue).encode()) != key_slot(keys.registry.encode())
    repeat.register(queue, "a", every_ms=1_000, misfire="all", template={"task": "t"}, now_ms=0)
    pump = Pump(repeat, [queue], target_of(client, queue), lease_ms=60_000)
    pump.run_once(now_ms=1_000)
    # A worker starts it: `running` holds a member (every key the claim names exists, so the
    # server runs it on the source rather than answering TRYAGAIN).
    assert repeat.report([report_of("started", message_of(client, queue))]) == 1
    repeat.trigger(queue, "a", now_ms=1_500)  # the leases key holds only its pending member
    with caplog.at_level(logging.ERROR), migrating(cluster, keys.registry):
        # The claim takes the slot due at 2000 and the trigger, then the ack drops both
        # leases, the last ones of the queue.
        tick = pump.run_once(now_ms=2_000)
    assert sorted((o.name, o.due_ms, o.triggered) for o in tick.dispatched) == [
        ("a", 1_500, True),
        ("a", 2_000, False),
    ]
    assert sorted(sent(client, queue)) == [("a", 1_500, True), ("a", 2_000, False)]
    assert repeat.leases(queue) == []
    registration = repeat.get(queue, "a")
    assert registration is not None
    assert (registration.next_run_ms, registration.fired) == (3_000, 3)
    assert errors_of(caplog) == []


def g_running_with_its_next_slot_buffered(
    client: redis.cluster.RedisCluster, queue: str
) -> tuple[Repeat, Pump, dict[str, Any]]:
    """`queue` with `g` (every second, buffer_one) and an hourly `idle`: g@1000 sent and
    started, g@2000 waiting in `buffered`; the registry, the pump and g@1000's message."""
    repeat = Repeat(client, "s26")
    template = {"task": "t"}
    repeat.register(queue, "g", every_ms=1_000, overlap="buffer_one", template=template, now_ms=0)
    repeat.register(queue, "idle", every_ms=3_600_000, template=template, now_ms=0)
    pump = Pump(repeat, [queue], target_of(client, queue), lease_ms=60_000)
    pump.run_once(now_ms=1_000)
    first = message_of(client, queue)
    assert repeat.report([report_of("started", first)]) == 1
    pump.run_once(now_ms=2_000)  # g@1000 still runs: g@2000 waits in `buffered`
    return repeat, pump, first


def test_a_final_report_that_empties_running_still_releases_the_buffered_slot_mid_migration(
    cluster: Cluster, client: redis.cluster.RedisCluster
) -> None:
    queue = "report"
    repeat, pump, first = g_running_with_its_next_slot_buffered(client, queue)
    keys = repeat.keys(queue)
    registration = repeat.get(queue, "g")
    assert registration is not None and registration.buffered_due_ms == 2_000
    repeat.trigger(queue, "idle", now_ms=2_000)  # so that the leases key exists
    with migrating(cluster, keys.registry):
        # g@1000 ends: it leaves `running` (its only member) and g@2000 is released into it.
        assert repeat.report([report_of("succeeded", first)]) == 1
    registration = repeat.get(queue, "g")
    assert registration is not None
    assert (registration.buffered_due_ms, registration.inflight) == (None, "g 2000")
    assert client.zscore(keys.running, "g 2000") is not None
    pump.run_once(now_ms=2_500)
    assert sorted(sent(client, queue)) == [("g", 2_000, False), ("idle", 2_000, True)]


def test_a_loss_that_empties_running_still_releases_the_buffered_slot_mid_migration(
    cluster: Cluster, client: redis.cluster.RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    queue = "lost"
    repeat, pump, _ = g_running_with_its_next_slot_buffered(client, queue)
    keys = repeat.keys(queue)
    # The worker of g@1000 dies: its heartbeat deadline (server clock) is past.
    assert client.zadd(keys.running, {"g 1000": 1}, xx=True, ch=True) == 1
    repeat.trigger(queue, "idle", now_ms=2_000)  # so that the leases key exists
    with caplog.at_level(logging.ERROR), migrating(cluster, keys.registry):
        # g@1000 is marked lost, leaving `running` empty, and g@2000 is released; the
        # trigger is sent. Then g@2000 is claimed and sent, and its ack drops the last lease.
        first = pump.run_once(now_ms=2_500)
        second = pump.run_once(now_ms=2_600)
    assert [(o.name, o.due_ms) for o in first.dispatched] == [("idle", 2_000)]
    assert [(o.name, o.due_ms) for o in second.dispatched] == [("g", 2_000)]
    assert sorted(sent(client, queue)) == [("g", 2_000, False), ("idle", 2_000, True)]
    assert [(e.due_ms, e.status) for e in repeat.history(queue, "g")] == [(1_000, "lost")]
    assert client.zrange(keys.running, 0, -1) == [b"g 2000"]
    assert repeat.leases(queue) == []
    assert errors_of(caplog) == []


def test_the_last_pump_of_a_queue_removes_its_heartbeat_mid_migration(
    cluster: Cluster, client: redis.cluster.RedisCluster
) -> None:
    queue = "pumps"
    repeat = Repeat(client, "s26")
    heartbeat = Heartbeat([queue], max_sleep_s=1.0)
    assert heartbeat.write(repeat)
    assert [p.id for p in repeat.pumps([queue])] == [heartbeat.id]
    with migrating(cluster, repeat.keys(queue).pumps):
        # What `Heartbeat.remove` calls when the pump stops (it only logs a failure, at
        # DEBUG: the heartbeat expires anyway). Its field is the table's last.
        repeat.remove_heartbeat([queue], heartbeat.id)
    assert repeat.pumps([queue]) == []
    assert client.exists(repeat.keys(queue).pumps) == 0
