"""Runs that overlap under `allow` are all in flight for a guarded policy edited in while
they go on (found by a probe, session 26).

`report.lua` kept a second run that started beside another in `inflight_also` only for a
guarded registration; under `allow` it was not tracked, so after an edit to `skip` the end of
the first run freed the registration while the second still ran, and the next slot was sent
beside it. Real server, the pump and the public report API.
"""

from __future__ import annotations

import pytest

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TEMPLATE = {"task": "t"}


def _fire(pump: Pump, now_ms: int) -> list[Occurrence]:
    return pump.run_once(now_ms=now_ms).dispatched


@pytest.mark.parametrize("policy", ["skip", "buffer_one"])
def test_an_edit_from_allow_sees_every_run_still_going(any_repeat: Repeat, policy: str) -> None:
    t0 = (any_repeat.server_time_ms() // 1000) * 1000 - 10_000
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    assert any_repeat.started(first)
    (second,) = _fire(pump, t0 + 2000)  # allow: sent while the first runs
    assert any_repeat.started(second)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap=policy, now_ms=t0)
    assert any_repeat.finished(first, ok=True)
    registration = any_repeat.get("q", "job")
    assert registration is not None and registration.inflight == second.lease_member
    assert _fire(pump, t0 + 3000) == []  # the second still runs: skipped, or kept
    assert any_repeat.finished(second, ok=True)
    after = _fire(pump, t0 + 4000)
    expected = [t0 + 3000] if policy == "buffer_one" else [t0 + 4000]
    assert [o.due_ms for o in after] == expected
