"""Garbage written by hand harms only itself (found by a fault probe):

- A registry, lease or in-flight member that is not valid UTF-8 was decoded with
  replacement characters, so no move named it: it stayed due at its score, and the pump
  ticked again at once, for ever (about 10,000 ERROR lines and a whole CPU in 6 s). Now a
  registry member is held for `CORRUPT_PARK_MS`, as a corrupt record is, and a lease or
  in-flight member is dropped, each told once.
- A history key of another type made `report.lua` fail the whole batch of its queue, so
  other registrations' reports were dropped (or half of a batch applied and the call told
  it failed). Now that report alone is not applied.
"""

from __future__ import annotations

import json
import logging

import pytest
import redis

from emq_bridge import ListPushDispatcher, Pump, Repeat, Reporter
from emq_bridge.lifecycle import report_of
from emq_bridge.pump import CORRUPT_PARK_MS

BAD = b"bad\xff\xfe"


@pytest.mark.parametrize(
    ("where", "member"),
    [("repeat", BAD), ("leases", BAD + b" 0"), ("running", BAD + b" 0")],
)
def test_a_member_that_is_not_utf8_is_set_aside_and_the_queue_goes_on(
    repeat: Repeat,
    client: redis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    where: str,
    member: bytes,
) -> None:
    repeat.register("g", "ok", every="1h", template={"task": "t"})
    repeat.trigger("g", "ok")
    key = f"{prefix}:{{g}}:{where}"
    client.zadd(key, {member: 0})
    pump = Pump(repeat, ["g"], ListPushDispatcher(client, f"{prefix}:out"))
    with caplog.at_level(logging.ERROR, logger="emq_bridge.pump"):
        first = pump.run_once()
        second = pump.run_once()
    assert [o.name for o in first.dispatched] == ["ok"] and second.dispatched == []
    score = client.zscore(key, member)
    if where == "repeat":
        assert score is not None and score >= first.now_ms + CORRUPT_PARK_MS - 1000
        assert second.next_wake_ms is None or second.next_wake_ms > second.now_ms
    else:
        assert score is None
    told = [r.getMessage() for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert len(told) == 1 and "bad" in told[0] and "xff" in told[0]


def test_a_history_key_of_another_type_refuses_its_report_alone(
    repeat: Repeat, client: redis.Redis, prefix: str
) -> None:
    for name in ("a", "b"):
        repeat.register("q", name, every="1h", template={"task": "t"}, overlap="skip")
        repeat.trigger("q", name)
    out = f"{prefix}:out"
    Pump(repeat, ["q"], ListPushDispatcher(client, out)).run_once()
    sent = {m["name"]: m for m in (json.loads(raw) for raw in client.lrange(out, 0, -1))}
    client.set(f"{prefix}:{{q}}:history:a", "planted by hand")
    started = [report_of("started", sent[name]) for name in ("a", "b")]
    assert repeat.report(started) == 1
    b = repeat.get("q", "b")
    assert b is not None and b.last_status == "running"
    # Through the reporter the adapters use: b's outcome is not dropped with a's.
    reporter = Reporter(repeat, linger_s=0.0)
    try:
        for name in ("a", "b"):
            reporter.report(report_of("succeeded", sent[name]))
        assert reporter.flush(10.0)
    finally:
        reporter.close()
    a, b = repeat.get("q", "a"), repeat.get("q", "b")
    assert a is not None and b is not None
    assert a.last_status is None
    assert b.last_status == "succeeded" and b.inflight is None
    assert [entry.status for entry in repeat.history("q", "b")] == ["succeeded"]
