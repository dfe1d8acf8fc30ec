"""One queue's failed report call drops only that queue's reports (found by a fault probe).

`Repeat.report` sends one `report.lua` call per queue of a batch. The first call that raised
(its Redis Cluster slot migrating: redis-py's `ClusterError("TTL exhausted.")`, a master
failing over, a key of the wrong type in one queue) ended the loop: the reports of the
queues after it were never sent, and the `Reporter` counted the whole batch as dropped. Now
every queue's call is made, the error names the queues whose call failed and counts their
reports, and the Reporter drops those alone. A cluster that kept redirecting says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import (
    RegistryError,
    RegistryUnavailable,
    ReportBatchError,
    ReportBatchUnavailable,
)
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter

from .cluster import Cluster

pytestmark = pytest.mark.faults

TEMPLATE = {"task": "reports.digest"}
# Names that no hex digest in a server's error text can hold.
BROKEN, HEALTHY = "broken", "healthy"


class Sent(Repeat):
    """The registry, keeping every batch the reporter sends to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list[Report]] = []

    def report(self, reports: Sequence[Report], **options: Any) -> int:
        self.batches.append(list(reports))
        return super().report(reports, **options)


def _occurrence(queue: str, due_ms: int) -> dict[str, Any]:
    return {"id": f"{queue}-job-{due_ms}", "queue": queue, "name": "job", "due_ms": due_ms}


def _batch(repeat: Repeat, client: redis.Redis) -> list[Report]:
    """Two heartbeats of the broken queue, whose whole call fails (its `running` key is a
    string, so report.lua's ZADD on it errors), then a final report of the healthy one."""
    now = repeat.server_time_ms()
    for queue in (BROKEN, HEALTHY):
        repeat.upsert(queue, "job", every="1h", template=TEMPLATE, now_ms=now - 60_000)
    client.set(repeat.keys(BROKEN).running, "not a sorted set")
    return [
        report_of("heartbeat", _occurrence(BROKEN, now)),
        report_of("heartbeat", _occurrence(BROKEN, now - 1_000)),
        report_of("succeeded", _occurrence(HEALTHY, now)),
    ]


def _statuses(repeat: Repeat, queue: str) -> list[str]:
    return [entry.status for entry in repeat.history(queue, "job")]


def test_a_queue_whose_call_fails_does_not_stop_the_next_queues_reports(
    repeat: Repeat, client: redis.Redis
) -> None:
    batch = _batch(repeat, client)

    with pytest.raises(ReportBatchError) as caught:
        repeat.report(batch)

    error = caught.value
    assert _statuses(repeat, HEALTHY) == ["succeeded"]
    assert (error.queues, error.applied, error.unsent) == ((BROKEN,), 1, 2)
    assert isinstance(error, RegistryError) and not isinstance(error, RegistryUnavailable)
    message = str(error)
    assert message.count(BROKEN) == 1 and HEALTHY not in message, message
    assert "report broken: WRONGTYPE" in message, message


def test_the_reporter_drops_only_the_failed_queues_reports_with_one_warning(
    redis_url: str, prefix: str, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Sent(redis.Redis.from_url(redis_url), prefix)
    batch = _batch(repeat, client)
    reporter = Reporter(repeat, linger_s=1.0)  # the three reports gather into one batch
    caplog.set_level(logging.INFO, logger="emq_bridge.reporting")
    try:
        for item in batch:
            reporter.report(item)
        assert reporter.flush()
        assert repeat.batches == [batch]
        assert _statuses(repeat, HEALTHY) == ["succeeded"]

        reporter.report(report_of("heartbeat", _occurrence(HEALTHY, 0)))  # goes through
        assert reporter.flush()
    finally:
        reporter.close()

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "report broken: WRONGTYPE" in warnings[0], warnings
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "occurrence reports reach Redis again; 2 were dropped meanwhile" in infos, infos


def test_a_batch_whose_every_call_met_an_outage_is_still_an_outage() -> None:
    server = EmbeddedServer().start()
    repeat = Repeat(redis.Redis.from_url(server.url, socket_timeout=2), "outage")
    server.stop()
    batch = [
        report_of("succeeded", _occurrence(BROKEN, 60_000)),
        report_of("succeeded", _occurrence(HEALTHY, 60_000)),
        report_of("heartbeat", _occurrence(HEALTHY, 0)),
    ]

    with pytest.raises(ReportBatchUnavailable) as caught:
        repeat.report(batch)

    error = caught.value
    assert isinstance(error, RegistryUnavailable)
    assert (error.queues, error.applied, error.unsent) == ((BROKEN, HEALTHY), 0, 3)
    assert "report broken: Redis is unreachable" in str(error), error
    assert "report healthy: Redis is unreachable" in str(error), error


# -- a Redis Cluster slot left migrating -------------------------------------------------------


def _leave_migrating(cluster: Cluster, repeat: Repeat, queue: str) -> None:
    """Start moving `queue`'s slot to another master and move its record alone: a script
    over its keys finds some of them on each node, and each node answers TRYAGAIN."""
    keys = repeat.keys(queue)
    slot = key_slot(keys.registry.encode())
    source = cluster.master_of(keys.registry)
    target = next(
        node
        for node in cluster.nodes[: cluster.masters]
        if node is not source and node.process is not None
    )
    with cluster.admin(source) as src, cluster.admin(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.cluster("myid"))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.cluster("myid"))
        src.execute_command(
            "MIGRATE", "127.0.0.1", target.port, "", 0, 5_000, "KEYS", keys.record("job")
        )


def test_a_slot_left_migrating_fails_its_queues_call_alone_and_says_the_cluster_redirected(
    cluster: Cluster,
) -> None:
    moving, healthy = "moving", "steady"
    repeat = Repeat(cluster.client(), "s26")
    now = repeat.server_time_ms()
    for queue in (moving, healthy):
        repeat.upsert(queue, "job", every="1h", template=TEMPLATE, now_ms=now - 60_000)
    assert key_slot(repeat.keys(moving).registry.encode()) != key_slot(
        repeat.keys(healthy).registry.encode()
    )
    _leave_migrating(cluster, repeat, moving)

    batch = [
        report_of("succeeded", _occurrence(moving, now)),
        report_of("succeeded", _occurrence(healthy, now)),
    ]
    with pytest.raises(ReportBatchError) as caught:
        repeat.report(batch)

    error = caught.value
    assert not isinstance(error, RegistryUnavailable)  # a pump goes on serving the others
    assert (error.queues, error.applied, error.unsent) == ((moving,), 1, 1)
    assert (
        "report moving: the Redis Cluster kept redirecting (a slot migrating or failing over):"
        " TTL exhausted." in str(error)
    ), error
    mapped = error.__cause__
    assert isinstance(mapped, RegistryError) and not isinstance(mapped, RegistryUnavailable)
    assert type(mapped.__cause__) is redis.exceptions.ClusterError  # what redis-py raises
    assert [e.status for e in repeat.history(healthy, "job")] == ["succeeded"]
