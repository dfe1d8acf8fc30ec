"""A registry server out of memory (noeviction, `maxmemory` reached: a shared Redis other
clients filled) refuses the workers' heartbeats and reports, so the pump must not take their
silence for a dead worker (found by a probe of eviction policies, session 34).

Before: `lost.lua`'s first write was a ZREM, which Redis never refuses, and once a script
has written, its later writes pass: the pump marked runs `lost` that were alive (a `skip`
schedule then sent its next slot beside the run: two at once) or had succeeded; and the
workers' reporters dropped what Redis refused for memory (a plain `RegistryError`), so those
runs stayed `lost`. Now an OOM refusal is `RegistryOutOfMemory`, an outage: `lost.lua` is
refused whole (a write that may grow memory goes first), the pump backs off and, once Redis
takes writes again, leaves lost deadlines for `LOST_GRACE_S`, and reporters keep their
reports and send them then. Real server (an embedded valkey of this test's own).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
import redis
from cli_runs import cli_runner

from emq_bridge import Occurrence, Pump, RegistryOutOfMemory, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.health import check
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

TTL_MS = 1_000


@pytest.fixture
def own() -> Iterator[Repeat]:
    with EmbeddedServer() as server:
        repeat = Repeat(redis.Redis.from_url(server.url), "oom")
        yield repeat
        repeat.client.config_set("maxmemory", 0)
        repeat.close()


def squeeze(repeat: Repeat) -> None:
    repeat.client.config_set("maxmemory-policy", "noeviction")
    # Well under what is used: Redis leaves some of it uncounted (clients' buffers).
    used = int(repeat.client.info("memory")["used_memory"])
    repeat.client.config_set("maxmemory", used - 200_000)


def running(repeat: Repeat, pump: Pump, recorder: RecordingDispatcher) -> Occurrence:
    repeat.upsert("q", "slow", every="1s", template={"task": "t"}, overlap="skip")
    deadline = time.monotonic() + 5
    while not recorder.occurrences and time.monotonic() < deadline:
        pump.step()
        time.sleep(0.05)
    [occurrence] = recorder.clear()
    assert repeat.started(occurrence, heartbeat_ttl_ms=TTL_MS)
    return occurrence


def status(repeat: Repeat, occurrence: Occurrence) -> str:
    return next(e.status for e in repeat.history("q", "slow") if e.id == occurrence.id)


def test_no_run_is_marked_lost_while_the_server_refuses_its_heartbeats(own: Repeat) -> None:
    recorder = RecordingDispatcher()
    pump = Pump(own, ["q"], recorder)
    occurrence = running(own, pump, recorder)
    time.sleep(TTL_MS / 1000 + 0.3)  # its heartbeat deadline passes while memory is full
    squeeze(own)
    member = occurrence.lease_member
    with pytest.raises(RegistryOutOfMemory, match="out of memory"):
        own.mark_lost("q", [member])
    assert own.client.zscore(own.keys("q").running, member) is not None  # nothing written
    assert pump.step()[0] is None and pump.in_outage  # the pump backs off, as in an outage
    assert status(own, occurrence) == "running"

    own.client.config_set("maxmemory", 0)
    tick, _ = pump.step()  # writes pass again: its kept report has not come yet
    assert tick is not None and not pump.in_outage
    assert status(own, occurrence) == "running"
    assert own.finished(occurrence, ok=True)
    registration = own.get("q", "slow")
    assert registration is not None and registration.lost == 0
    assert status(own, occurrence) == "succeeded"


def test_a_reporter_keeps_what_the_server_refused_for_memory_and_sends_it_after(
    own: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = RecordingDispatcher()
    occurrence = running(own, Pump(own, ["q"], recorder), recorder)
    caplog.set_level(logging.INFO, logger="emq_bridge")
    reporter = Reporter(own, heartbeat_s=60)
    squeeze(own)
    try:
        reporter.report(_final(occurrence))
        deadline = time.monotonic() + 5  # its thread tries (a flush would drop, not keep)
        while "wait until Redis takes them again" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        assert status(own, occurrence) == "running"
        assert "dropped" not in caplog.text
        own.client.config_set("maxmemory", 0)
        assert reporter.flush(10.0)
    finally:
        reporter.close(1.0)
    assert status(own, occurrence) == "succeeded"


def _final(occurrence: Occurrence) -> Report:
    return report_of("succeeded", occurrence, attempt=1)


def test_health_and_the_cli_say_the_server_is_out_of_memory(own: Repeat) -> None:
    # Before: `health` said "no live pump serves queue ..." (exit 4), blaming the pumps whose
    # heartbeats Redis refused, and a write from the CLI said "cannot reach Redis".
    own.upsert("q", "job", every="1h", template={"task": "t"})
    url = own.client.connection_pool.connection_kwargs
    run = cli_runner(f"redis://{url['host']}:{url['port']}/0", "oom")
    assert run("health").exit_code == 4  # no pump ever ran: unhealthy, not out of memory
    squeeze(own)
    found = check(own)
    assert not found.ok and found.out_of_memory
    assert found.reason.startswith("Redis is out of memory (used_memory has reached maxmemory)")
    result = run("health", "--json")
    assert result.exit_code == 3, result.output
    assert json.loads(result.stdout)["out_of_memory"] is True
    assert "no live pump" in result.stderr  # what it found, after the cause
    added = run("add", "q", "other", "--task", "t", "--every", "1h")
    assert added.exit_code == 3
    assert "refused" in added.stderr and "out of memory and refuses writes" in added.stderr
    assert "cannot reach" not in added.stderr
    own.client.config_set("maxmemory", 0)
    found = check(own)
    assert not found.out_of_memory and "out of memory" not in found.reason
