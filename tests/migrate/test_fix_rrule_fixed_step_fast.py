"""A fixed-step redbeat rrule (no by* part, dtstart in UTC or a fixed offset) is carried by
arithmetic on its slots, the same as dateutil's walk gives, at once however long ago it
started. Before, every import walked its slots from dtstart 64 times: a minutely rrule
started in 2025 took about two minutes of CPU, during which a cut-over's other slots passed."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redbeat.schedules import rrule

from emq_bridge.celery.importers.redbeat import importer_app
from emq_bridge.celery.importers.schedules import (
    Unrepresentable,
    _fixed_step,
    _fixed_step_rrule,
    _rrule_walked,
    carry,
)
from emq_bridge.millis import instant_ms

NOW = datetime(2030, 6, 1, 12, 0, 0, 321_000, tzinfo=timezone.utc)
FREQS = {"SECONDLY": 1, "MINUTELY": 60, "HOURLY": 3600, "DAILY": 86_400, "WEEKLY": 604_800}


def _carried(fn, *args):  # type: ignore[no-untyped-def]
    try:
        c = fn(*args)
    except Unrepresentable:
        return None
    return None if c is None else (c.cadence, c.first_run_ms, c.end_ms, c.limit)


@settings(max_examples=150, deadline=None)
@given(
    freq=st.sampled_from(sorted(FREQS)),
    interval=st.integers(1, 4),
    start_steps=st.integers(-30, 30),
    start_us=st.integers(0, 999_999),
    offset_h=st.sampled_from([0, 2, -5]),
    count=st.one_of(st.none(), st.integers(1, 40)),
    until_steps=st.one_of(st.none(), st.integers(-10, 40)),
    last_steps=st.one_of(st.none(), st.integers(-35, 35)),
)
def test_the_arithmetic_gives_what_dateutils_walk_gives(
    freq: str,
    interval: int,
    start_steps: int,
    start_us: int,
    offset_h: int,
    count: int | None,
    until_steps: int | None,
    last_steps: int | None,
) -> None:
    step = timedelta(seconds=FREQS[freq] * interval)
    zone = timezone(timedelta(hours=offset_h))
    dtstart = (NOW + start_steps * step).replace(microsecond=start_us).astimezone(zone)
    until = None if until_steps is None or count else NOW + until_steps * step
    value = rrule(freq, dtstart=dtstart, interval=interval, count=count, until=until)
    grid = _fixed_step(value)
    assert grid is not None
    now_ms = instant_ms(NOW)
    last = None if last_steps is None else instant_ms(NOW + last_steps * step / 2)
    fast = _carried(_fixed_step_rrule, value, grid, last, now_ms)
    walked = _carried(_rrule_walked, value, last, now_ms)
    assert fast == walked


def test_a_minutely_rrule_of_a_year_ago_is_carried_at_once() -> None:
    value = rrule("MINUTELY", dtstart=datetime(2025, 6, 1, tzinfo=timezone.utc))
    started = time.process_time()
    carried = carry(value, importer_app(), "r", last_run_ms=None, now_ms=instant_ms(NOW))
    assert time.process_time() - started < 1.0  # about 2 minutes before; not a speed test
    assert carried.first_run_ms == instant_ms(NOW.replace(second=0, microsecond=0))


BY_FREQS = ["WEEKLY", "DAILY", "HOURLY", "MINUTELY"]


@settings(max_examples=60, deadline=None)
@given(
    freq=st.sampled_from(BY_FREQS),
    hours=st.lists(st.integers(0, 23), min_size=1, max_size=4, unique=True),
    minutes=st.one_of(st.none(), st.lists(st.integers(0, 59), min_size=1, max_size=3)),
    weekdays=st.one_of(st.none(), st.lists(st.integers(0, 6), min_size=1, max_size=3)),
    start_days=st.integers(-40, 3),
    offset_h=st.sampled_from([0, 2, -5]),
    last_hours=st.one_of(st.none(), st.integers(-24 * 30, 24)),
)
def test_a_rule_with_by_parts_walked_from_near_its_last_run_gives_the_same(
    freq: str,
    hours: list[int],
    minutes: list[int] | None,
    weekdays: list[int] | None,
    start_days: int,
    offset_h: int,
    last_hours: int | None,
) -> None:
    from emq_bridge.celery.importers import schedules

    zone = timezone(timedelta(hours=offset_h))
    dtstart = (NOW + timedelta(days=start_days)).replace(second=0, microsecond=0).astimezone(zone)
    options: dict[str, Any] = {"byhour": hours}
    if minutes is not None:
        options["byminute"] = minutes
    if weekdays is not None:
        options["byweekday"] = weekdays
    value = rrule(freq, dtstart=dtstart, **options)
    now_ms = instant_ms(NOW)
    last = None if last_hours is None else instant_ms(NOW + timedelta(hours=last_hours))
    near = _carried(_rrule_walked, value, last, now_ms)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(schedules, "_walked_from", lambda value, since: value.rrule)
        from_dtstart = _carried(_rrule_walked, value, last, now_ms)
    assert near == from_dtstart


def test_a_cron_like_rrule_of_a_year_ago_is_carried_at_once() -> None:
    value = rrule(
        "MINUTELY", dtstart=datetime(2025, 6, 1, tzinfo=timezone.utc), byhour=list(range(24))
    )
    started = time.process_time()
    carried = carry(value, importer_app(), "r", last_run_ms=None, now_ms=instant_ms(NOW))
    assert time.process_time() - started < 5.0  # over 100 s before; not a speed test
    assert carried.first_run_ms == instant_ms(NOW.replace(second=0, microsecond=0))


def test_an_rrule_that_ended_over_a_week_ago_fires_its_last_slot_walked_or_not() -> None:
    # Hypothesis found it: a weekly rule whose `until` passed two weeks ago, never run. The
    # walk started a week before now, past its last slot, and gave "now" as the slot to fire
    # (an off-grid nominal time); the arithmetic gave the last slot, as it should.
    dtstart = (NOW - timedelta(weeks=2)).replace(microsecond=0)
    value = rrule("WEEKLY", dtstart=dtstart, until=NOW - timedelta(weeks=2))
    grid = _fixed_step(value)
    assert grid is not None
    now_ms = instant_ms(NOW)
    walked = _carried(_rrule_walked, value, None, now_ms)
    assert walked == _carried(_fixed_step_rrule, value, grid, None, now_ms)
    assert walked is not None and walked[1] == instant_ms(dtstart)
