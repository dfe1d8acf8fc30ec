"""A registry member that is no valid name is set aside, not a crash of every tick (found by
a probe of damaged registries, session 36).

A member planted by hand with a space (`ZADD emq:{q}:repeat 0 "a b"`) or empty, beside its
record: the claim leased it with the healthy ones of its batch and sent them, then the ack
failed to read its lease back (`ValueError` from `parse_lease_member`): the pump crashed on
every tick (`emq-bridge pump` exited 1 with a traceback), served no other queue, and, with
nothing acked, sent the healthy schedules again at each lease expiry. Such a member is now
held for `CORRUPT_PARK_MS` with one line saying how to remove it (no command takes such a
name), and the rest fire once each. A real server.
"""

from __future__ import annotations

import logging

import pytest
import redis

from emq_bridge import Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

BAD_NAMES = ["a b", ""]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_member_that_is_no_name_is_set_aside_and_the_others_fire_once(
    client: redis.Redis, prefix: str, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(1_900_000_000_000)
    repeat = Repeat(client, prefix, clock=clock)
    for queue in ("qx", "qy"):
        repeat.upsert(queue, "ok", every="1s", template={"task": "t"})
    keys = repeat.keys("qx")
    record = client.hgetall(keys.record("ok"))
    client.hset(f"{keys.registry}:{bad}", mapping=record)  # a copy of a good record
    client.zadd(keys.registry, {bad: 0})
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["qx", "qy"], dispatcher, lease_ms=1_500)
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        for _ in range(5):
            clock.advance(1_000)
            pump.run_once()
    sent = [(o.queue, o.name, o.due_ms) for o in dispatcher.occurrences]
    assert len(sent) == len(set(sent)), sent  # nothing sent twice
    assert {q for q, _, _ in sent} == {"qx", "qy"}
    assert all(name == "ok" for _, name, _ in sent), sent
    for queue in ("qx", "qy"):
        found = repeat.get(queue, "ok")
        assert found is not None and found.fired == 5  # every send acked
    told = [r.getMessage() for r in caplog.records if "no valid name" in r.getMessage()]
    assert told and "remove it with ZREM" in told[0], [r.getMessage() for r in caplog.records]
    assert client.zscore(keys.registry, bad) is not None  # held, not deleted
