"""`last_success_ms` moved backwards when two workers' reports of successes arrived out of
order (found by a probe of Dramatiq workers on RabbitMQ, session 33): the run that ended
later, reported first, was replaced by the one that ended earlier, and the next occurrence
was sent an older "last success" (`current_occurrence().last_success_ms`). The latest
success stands now, whatever order the reports come in. On both backends.
"""

from __future__ import annotations

from emq_bridge import Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000


def test_the_latest_success_stands_whatever_order_the_reports_come_in(any_repeat: Repeat) -> None:
    any_repeat.register("q", "s", every="1s", template={"task": "t"}, now_ms=T0)
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["q"], recorder)
    pump.run_once(T0 + 1000)
    pump.run_once(T0 + 2000)
    first, second = recorder.clear()
    later = report_of("succeeded", second, at_ms=T0 + 2950)
    earlier = report_of("succeeded", first, at_ms=T0 + 2900)
    assert any_repeat.report([later]) == 1
    assert any_repeat.report([earlier]) == 1  # another worker's, arriving after

    record = any_repeat.get("q", "s")
    assert record is not None and record.last_success_ms == T0 + 2950
    pump.run_once(T0 + 3000)
    [third] = recorder.clear()
    assert third.last_success_ms == T0 + 2950
