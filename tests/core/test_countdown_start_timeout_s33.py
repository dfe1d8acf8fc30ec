"""A guarded occurrence whose task waits before a worker may start it (a Celery `countdown`
or `eta` longer than the start timeout) was marked `lost` while it waited, and its next slot
sent beside it (found by a probe of Celery's send options, session 33: `countdown=660` on a
`skip` schedule every minute, past the 10-minute start timeout). The pump now adds the
dispatcher's `delay_ms` to the start timeout. The deadlines of occurrences in flight run on
the server's clock: here a start timeout of 1 s and a countdown of 2 s, on the test server
and on fakeredis (`any_repeat`), with a dispatcher that reads the delay from the template as
`CeleryDispatcher.delay_ms` does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TEMPLATE = {"task": "t", "options": {"countdown": 2}}


class Delaying(RecordingDispatcher):
    def delay_ms(self, template: Mapping[str, Any]) -> int | None:
        countdown = (template.get("options") or {}).get("countdown")
        return None if countdown is None else int(countdown * 1000)


def first_sent(pump: Pump) -> Any:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sent = pump.run_once().dispatched
        if sent:
            return sent[0]
        time.sleep(0.05)
    raise AssertionError("nothing came due")


def test_a_guarded_occurrence_waiting_out_its_countdown_is_in_flight_then_lost(
    any_repeat: Repeat,
) -> None:
    any_repeat.upsert("q", "slow", every="1s", overlap="skip", template=TEMPLATE)
    pump = Pump(any_repeat, ["q"], Delaying(), start_timeout_ms=1000)
    first = first_sent(pump)
    claimed = time.monotonic()

    while time.monotonic() - claimed < 2.5:  # past the start timeout, within its countdown
        assert pump.run_once().dispatched == [], "a slot sent beside the waiting one"
        time.sleep(0.1)
    record = any_repeat.get("q", "slow")
    assert record is not None and record.lost == 0 and record.skipped >= 1

    time.sleep(max(0.0, claimed + 3.3 - time.monotonic()))  # start timeout + countdown
    pump.run_once()
    record = any_repeat.get("q", "slow")
    assert record is not None and record.lost == 1  # never started: lost then
    assert next(e for e in any_repeat.history("q", "slow") if e.id == first.id).status == "lost"
