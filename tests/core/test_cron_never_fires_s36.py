"""A cron whose day of the month is in none of its months is refused saying it never fires
(found by a probe of the calendar's edges, session 36: cronsim's "Bad day-of-month" alone
did not say that no February has a 30th). docs/cron.md."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from emq_bridge import Cron, ScheduleError


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("0 0 30 2 *", "no month 2 has a day 30"),
        ("0 0 31 4 *", "no month 4 has a day 31"),
        ("0 0 31 2,4,6 *", "no month 2,4,6 has a day 31"),
    ],
)
def test_a_day_in_none_of_its_months_never_fires(expr: str, why: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        Cron(expr)
    assert str(raised.value) == f"cron {expr!r} never fires: {why}"


def test_with_a_weekday_it_fires_on_those_weekdays_of_its_months() -> None:
    first = Cron("0 0 30 2 1").first_run(
        int(datetime(2027, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    )
    assert datetime.fromtimestamp(first / 1000, timezone.utc) == datetime(
        2027, 2, 1, tzinfo=timezone.utc
    )
    with pytest.raises(ScheduleError, match="never fires"):
        Cron("0 0 30 2 1", day_and=True)  # both: a 30 February that is a Monday


def test_another_error_of_the_same_cron_is_told_as_it_is() -> None:
    # The review: a bad minute beside a day in no month was told as "never fires".
    with pytest.raises(ScheduleError, match="Bad minute"):
        Cron("99 0 30 2 *")
