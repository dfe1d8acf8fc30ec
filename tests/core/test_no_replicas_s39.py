"""A master with `min-replicas-to-write` (guarantees.md, "Failover") refuses writes with
NOREPLICAS while too few replicas are in sync: an outage, as READONLY is, not a broken
registry. Before (the Sentinel probe of session 39), a worker's reporter dropped its reports
on it ("dropped until Redis takes them again"), so runs that succeeded were marked `lost`,
and a beat logged a broken queue at ERROR. Real replies of a real server with no replica."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import RegistryUnavailable
from emq_bridge.lifecycle import report_of
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher


@pytest.fixture
def server() -> Iterator[redis.Redis]:
    with EmbeddedServer() as embedded, redis.Redis.from_url(embedded.url) as client:
        yield client


def refuse_writes(client: redis.Redis, refuse: bool) -> None:
    client.config_set("min-replicas-to-write", 1 if refuse else 0)


def test_a_write_refused_for_want_of_replicas_is_an_outage(server: redis.Redis) -> None:
    repeat = Repeat(server, "nr")
    refuse_writes(server, True)
    with pytest.raises(RegistryUnavailable, match="too few replicas are in sync"):
        repeat.register("q", "job", every="1h", template={"task": "t"})
    refuse_writes(server, False)
    assert repeat.register("q", "job", every="1h", template={"task": "t"}) == "registered"


def test_a_pump_and_a_reporter_keep_what_they_could_not_write_until_writes_come_back(
    server: redis.Redis,
) -> None:
    repeat = Repeat(server, "nr")
    repeat.register("q", "job", every="1h", template={"task": "t"}, immediately=True)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    pump.run_once()
    occurrence: Occurrence
    (occurrence,) = sent.clear()
    reporter = Reporter(lambda: repeat, heartbeat_s=1.0, linger_s=0.0)
    try:
        refuse_writes(server, True)
        with pytest.raises(RegistryUnavailable):
            pump.run_once(occurrence.due_ms + 3_600_000)
        reporter.report(report_of("succeeded", occurrence))
        deadline = time.monotonic() + 10
        while not reporter._waiting:  # its send refused: kept (not dropped), tried again
            assert time.monotonic() < deadline, "the reporter never met the refusal"
            time.sleep(0.02)
        assert repeat.history("q", "job") == []
        refuse_writes(server, False)
        while repeat.history("q", "job") == []:  # sent again once writes come back
            assert time.monotonic() < deadline + 10, "the kept report never arrived"
            time.sleep(0.05)
        (entry,) = repeat.history("q", "job")
        assert (entry.id, entry.status) == (occurrence.id, "succeeded")
    finally:
        refuse_writes(server, False)
        reporter.close(5.0)
