"""Reports sent to a read-only replica (a worker still connected to a demoted master, or
pointed at the replica of a registry being moved) fail as an outage, so the reporter keeps
them, instead of being skipped in silence (found by a probe of moving the registry, session
34: 36 runs' reports vanished, applied 0, nothing logged). `report.lua` wrote the history
with `pcall`, which took any refusal for a history key of another type. Real servers: an
embedded master and its replica."""

from __future__ import annotations

import time

import pytest
import redis

from emq_bridge import Pump, RegistryUnavailable, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher


def test_a_report_to_a_read_only_replica_fails_as_an_outage() -> None:
    with EmbeddedServer() as master, EmbeddedServer() as replica:
        primary = Repeat(redis.Redis.from_url(master.url), "ro")
        primary.register("q", "job", every="1h", template={"task": "t"}, immediately=True)
        recorder = RecordingDispatcher()
        Pump(primary, ["q"], recorder).run_once()
        (occurrence,) = recorder.clear()
        follower = Repeat(redis.Redis.from_url(replica.url), "ro")
        follower.client.replicaof("127.0.0.1", master.port)
        deadline = time.monotonic() + 10
        while follower.get("q", "job") is None:
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        for kind in ("started", "succeeded", "failed"):
            with pytest.raises(RegistryUnavailable, match="read only replica"):  # before: 0
                follower.report([report_of(kind, occurrence)])  # type: ignore[arg-type]
        assert primary.history("q", "job") == []  # nothing reached the master meanwhile
        assert primary.report([report_of("succeeded", occurrence)]) == 1  # the master takes it
