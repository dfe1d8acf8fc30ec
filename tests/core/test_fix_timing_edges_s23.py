"""Two timing edges a probe found (docs/timing.md).

- A one-off whose instant equals the instant it is created at was created completed and
  never fired: that instant has not passed.
- A cron's slots in the last three hours of year 9999 (on the zone's wall clock) were lost:
  the DST look-around (3 hours either side) overflowed past 9999 and the slot read as none,
  though timing.md keeps instants to the end of 9999; `add` refused such a schedule.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from cli_runs import cli_runner

from emq_bridge import Pump, Repeat
from emq_bridge.cadence import NEVER_MS, Cron
from emq_bridge.testing import RecordingDispatcher


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_a_one_off_at_the_instant_it_is_created_fires_once(repeat: Repeat) -> None:
    now = _ms("2030-01-01T10:00:00+00:00")
    repeat.register("q", "now", at="2030-01-01T10:00:00Z", template={"task": "t"}, now_ms=now)
    registration = repeat.get("q", "now")
    assert registration is not None and not registration.completed
    assert registration.next_run_ms == now
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    assert [o.due_ms for o in pump.run_once(now_ms=now).dispatched] == [now]
    assert pump.run_once(now_ms=now + 1000).dispatched == []
    done = repeat.get("q", "now")
    assert done is not None and done.completed
    # One already past by a millisecond still does not fire (the rule the page states).
    repeat.register("q", "late", at="2030-01-01T10:00:00Z", template={"task": "t"}, now_ms=now + 1)
    late = repeat.get("q", "late")
    assert late is not None and late.completed


@pytest.mark.parametrize(
    ("expression", "zone", "expected"),
    [
        ("0 21 31 12 *", "UTC", "9999-12-31T21:00:00+00:00"),
        ("59 23 31 12 *", "UTC", "9999-12-31T23:59:00+00:00"),
        ("30 59 23 31 12 *", "UTC", "9999-12-31T23:59:30+00:00"),
        ("0 23 31 12 *", "Asia/Tokyo", "9999-12-31T14:00:00+00:00"),
        ("0 22 31 12 *", "Pacific/Kiritimati", "9999-12-31T08:00:00+00:00"),
    ],
)
def test_the_last_slots_of_year_9999_are_slots(expression: str, zone: str, expected: str) -> None:
    cron = Cron(expression, zone)
    assert cron.next_after(_ms("9999-12-01T00:00:00+00:00")) == _ms(expected)


def test_a_slot_past_9999_in_utc_is_none() -> None:
    # 20:00 in New York on 31 December 9999 is 01:00 UTC in year 10000: no slot.
    assert Cron("0 20 31 12 *", "America/New_York").next_after(
        _ms("9999-12-01T00:00:00+00:00")
    ) == (NEVER_MS)


def test_add_takes_a_cron_whose_only_slot_is_in_the_last_hour_of_9999(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    result = cli_runner(redis_url, prefix)(
        "add",
        "q",
        "y3",
        "--task",
        "t",
        "--cron",
        "59 23 31 12 *",
        "--start-at",
        "9999-12-31T23:00:00Z",
    )
    assert result.exit_code == 0, result.output
    registration = repeat.get("q", "y3")
    assert registration is not None
    assert registration.next_run_ms == _ms("9999-12-31T23:59:00+00:00")
