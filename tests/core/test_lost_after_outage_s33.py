"""After an outage of the registry, a pump marked lost at once every occurrence whose
heartbeats had lapsed during it, before the workers could send what they kept (found by a
probe of the operating surfaces, session 33): two runs that had succeeded during a 20 s
outage were `lost`, with a false WARNING, in `show`'s `lost` and the `lost` outcome metric,
and a `skip` schedule would be freed while its run went on. Their workers' reporters keep
heartbeats and final reports through an outage and send them once Redis answers (tries at
most `RETRY_MAX_S` apart), so the pump now leaves lost deadlines for `LOST_GRACE_S` after it
sees Redis again; an occurrence still silent then is lost, as before. Real server; the
outage is the pump's registry swapped for one where nothing listens.
"""

from __future__ import annotations

import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import emq_bridge.pump as pump_module
from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TTL_MS = 1_000


def running_occurrence(repeat: Repeat, pump: Pump, recorder: RecordingDispatcher) -> Occurrence:
    """A guarded schedule's occurrence, started by its worker with a heartbeat TTL of 1 s."""
    repeat.upsert("q", "slow", every="1s", template={"task": "t"}, overlap="skip")
    deadline = time.monotonic() + 5
    while not recorder.occurrences and time.monotonic() < deadline:
        pump.step()
        time.sleep(0.05)
    [occurrence] = recorder.clear()
    assert repeat.started(occurrence, heartbeat_ttl_ms=TTL_MS)
    return occurrence


def outage(pump: Pump, live: Repeat, seconds: float) -> None:
    """The pump meets an outage of `seconds`, then Redis again (its next step)."""
    refused = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    pump.repeat = Repeat(refused)
    assert pump.step()[0] is None and pump.in_outage
    time.sleep(seconds)
    pump.repeat.close()
    pump.repeat = live


def status(repeat: Repeat, occurrence: Occurrence) -> str:
    return next(e.status for e in repeat.history("q", "slow") if e.id == occurrence.id)


def test_a_run_that_ended_during_an_outage_is_not_lost_when_its_report_comes_after_it(
    repeat: Repeat,
) -> None:
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    occurrence = running_occurrence(repeat, pump, recorder)
    outage(pump, repeat, TTL_MS / 1000 + 0.5)  # its deadline passed during the outage

    tick, _ = pump.step()  # Redis again: the worker has not sent what it kept yet
    assert tick is not None and not pump.in_outage
    assert status(repeat, occurrence) == "running"
    assert repeat.finished(occurrence, ok=True)  # its kept final report, a moment later
    pump.step()
    record = repeat.get("q", "slow")
    assert record is not None and record.lost == 0 and record.last_status == "succeeded"
    assert status(repeat, occurrence) == "succeeded"


def test_an_occurrence_still_silent_after_the_grace_is_lost(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pump_module, "LOST_GRACE_S", 1.0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    occurrence = running_occurrence(repeat, pump, recorder)
    outage(pump, repeat, TTL_MS / 1000 + 0.5)

    tick, delay = pump.step()
    assert tick is not None and status(repeat, occurrence) == "running"
    assert delay <= 1.0  # it wakes for the grace's end
    time.sleep(1.1)
    pump.step()
    record = repeat.get("q", "slow")
    assert record is not None and record.lost == 1 and status(repeat, occurrence) == "lost"
