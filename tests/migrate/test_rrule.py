"""celery-redbeat's rrules carried as intervals or crons: exact on their next slots, or
refused; a count and an until become the end bound."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from itertools import islice

import pytest
from dateutil.rrule import FR, MO
from redbeat.schedules import rrule

from emq_bridge.cadence import next_runs
from emq_bridge.celery.importers.redbeat import importer_app
from emq_bridge.celery.importers.schedules import Unrepresentable, carry, epoch_ms

PARIS_WINTER = timezone(timedelta(hours=1))  # what redbeat stores: a fixed offset
START = datetime(2026, 1, 5, 9, 30, tzinfo=PARIS_WINTER)
NOW = datetime(2026, 3, 1, 12, 0, 7, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("options", "described"),
    [
        # A fixed-length rrule: an interval on its grid, offset by its dtstart (08:30 UTC on
        # Monday 2026-01-05) from the epoch's grid (Thursday 1970-01-01 00:00 UTC).
        ({"freq": "MINUTELY", "interval": 7}, "every 7m offset 5m"),
        ({"freq": "WEEKLY", "interval": 2}, "every 14d offset 6270m"),
        ({"freq": "DAILY", "byhour": [6, 18], "byminute": 15}, "cron 15 6,18 * * * (Etc/GMT-1)"),
        ({"freq": "WEEKLY", "byweekday": [MO, FR]}, "cron 30 9 * * 1,5 (Etc/GMT-1)"),
        ({"freq": "MONTHLY", "bymonthday": [1, 15]}, "cron 30 9 1,15 * * (Etc/GMT-1)"),
        ({"freq": "YEARLY"}, "cron 30 9 5 1 * (Etc/GMT-1)"),
        ({"freq": "HOURLY", "byminute": [0, 30]}, "cron 0,30 * * * * (Etc/GMT-1)"),
    ],
)
def test_an_rrule_becomes_the_cadence_that_gives_exactly_its_slots(
    options: dict[str, object], described: str
) -> None:
    value = rrule(dtstart=START, **options)
    last = NOW - timedelta(seconds=1)
    carried = carry(value, importer_app(), "r", last_run_ms=epoch_ms(last), now_ms=epoch_ms(NOW))
    assert carried.cadence.describe() == described
    expected = [epoch_ms(d) for d in islice(value.rrule.xafter(last), 20)]
    assert [carried.first_run_ms, *next_runs(carried.cadence, carried.first_run_ms, 19)] == expected


@pytest.mark.parametrize(
    "options",
    [
        {"freq": "MONTHLY", "byweekday": MO(2)},  # the second Monday
        {"freq": "MONTHLY", "bymonthday": -1},  # the last day
        {"freq": "DAILY", "interval": 3, "byhour": 9},  # every third day at 9
        {"freq": "MINUTELY", "bysecond": 30},  # seconds
        {"freq": "YEARLY", "byweekno": 20},
    ],
)
def test_an_rrule_no_cron_or_interval_gives_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(Unrepresentable, match="no exact cron or interval equivalent"):
        carry(rrule(dtstart=START, **options), importer_app(), "r", last_run_ms=None, now_ms=0)


def test_an_overdue_counted_rrule_keeps_the_runs_redbeat_still_makes() -> None:
    start = NOW.replace(microsecond=0) - timedelta(seconds=50)
    value = rrule("SECONDLY", dtstart=start, count=100, until=None)
    carried = carry(value, importer_app(), "r", last_run_ms=epoch_ms(start), now_ms=epoch_ms(NOW))
    # Overdue: the latest slot fires at once (as redbeat fires at once), on the grid, then
    # the slots after now up to the count's last one, its end bound (the same whenever it
    # is read: a second import changes nothing).
    assert carried.first_run_ms == epoch_ms(NOW.replace(microsecond=0))
    assert (carried.limit, carried.end_ms) == (None, epoch_ms(start + timedelta(seconds=99)))
    later = carry(
        value, importer_app(), "r", last_run_ms=epoch_ms(start), now_ms=epoch_ms(NOW) + 5000
    )
    assert (later.limit, later.end_ms) == (carried.limit, carried.end_ms)
    until = rrule("DAILY", dtstart=START, until=START + timedelta(days=30))
    bounded = carry(until, importer_app(), "r", last_run_ms=epoch_ms(START), now_ms=epoch_ms(START))
    assert bounded.end_ms == epoch_ms(START + timedelta(days=30))
