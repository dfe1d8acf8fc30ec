"""Large batches: a pump configured with a batch far above the default still acks it.

Lua's `unpack` fails past a few thousand values; an ack that failed on it would leave the
whole batch to be re-dispatched after every lease, forever.
"""

from __future__ import annotations

import pytest
import redis

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import RecordingDispatcher

pytestmark = pytest.mark.faults


def test_a_batch_of_ten_thousand_occurrences_is_dispatched_and_acked_once(
    own_client: redis.Redis,
) -> None:
    repeat = Repeat(own_client, "big")
    definition = define(every_ms=1_000, template={"task": "t"})
    repeat.upsert_many([("q", f"n{i}", definition) for i in range(10_000)], now_ms=0)
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher, batch_size=10_000, lease_ms=1_000)

    tick = pump.run_once(now_ms=1_000)

    assert len(tick.dispatched) == 10_000
    assert own_client.zcard(repeat.keys("q").leases) == 0
    assert pump.run_once(now_ms=1_999).dispatched == []  # nothing left to re-dispatch
