"""Cadence math: intervals with both anchors, misfire policies, cron across DST."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import croniter
import pytest
from cron_oracle import Oracle, transitions
from hypothesis import given
from hypothesis import strategies as st

from emq_bridge import Cron, Every, ScheduleError, advance, next_runs, parse_every, parse_every_ms

MIN = 60_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("15m", 900_000),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("1.5h", 5_400_000),
        ("0.5s", 500),
        ("1.25m 0.5s", 75_500),
        ("1w", 604_800_000),
        ("250", 250),
        (timedelta(minutes=5), 300_000),
        (timedelta(seconds=1.001), 1001),  # 1000.9999999999999 ms through a float
        (timedelta(milliseconds=5, microseconds=900), 5),  # a partial ms is dropped
        (42, 42),
    ],
)
def test_every_accepts_ms_timedeltas_and_unit_strings(text: object, ms: int) -> None:
    assert parse_every_ms(text) == ms  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        0,
        -5,
        "0s",
        "",
        "15 minutes",
        "m",
        "0.5ms",
        "1.0005s",
        "1.s",
        ".5s",
        True,
        None,
        1.5,
        timedelta(0),
    ],
)
def test_every_rejects_what_is_not_a_positive_interval(bad: object) -> None:
    with pytest.raises(ScheduleError):
        parse_every_ms(bad)  # type: ignore[arg-type]


# (every_ms, anchor, misfire, due, now) -> (next, missed)
INTERVAL_TABLE = [
    (15 * MIN, "schedule", "coalesce", 0, 7_000, 15 * MIN, 0),  # on time: due + every
    (15 * MIN, "release", "coalesce", 0, 7_000, 15 * MIN + 7_000, 0),  # EchoMQ: now + every
    (15 * MIN, "schedule", "coalesce", 0, 50 * MIN, 60 * MIN, 3),  # down 50 min: 3 dropped
    (15 * MIN, "schedule", "catchup", 0, 50 * MIN, 15 * MIN, 0),  # catch-up: next slot
    (15 * MIN, "release", "coalesce", 0, 50 * MIN, 65 * MIN, 3),
    (15 * MIN, "schedule", "coalesce", 0, 15 * MIN, 30 * MIN, 1),  # exactly one period late
]


@pytest.mark.parametrize(
    ("every", "anchor", "misfire", "due", "now", "next_ms", "missed"), INTERVAL_TABLE
)
def test_an_interval_advances_per_its_anchor_and_misfire_policy(
    every: int, anchor: str, misfire: str, due: int, now: int, next_ms: int, missed: int
) -> None:
    assert advance(Every(every, anchor), due, now, misfire) == (next_ms, missed)  # type: ignore[arg-type]


@given(
    every=st.integers(1, 10**7),
    due=st.integers(0, 10**12),
    late=st.integers(0, 10**9),
)
def test_a_schedule_anchored_interval_never_drifts_and_counts_every_dropped_slot(
    every: int, due: int, late: int
) -> None:
    now = due + late
    next_ms, missed = advance(Every(every, "schedule"), due, now)
    assert next_ms > now
    assert (next_ms - due) % every == 0  # stays on the grid
    assert missed == (next_ms - due) // every - 1  # every grid slot skipped is counted


def test_a_fifteen_minute_interval_stays_on_the_quarter_hours_despite_late_releases() -> None:
    cadence = Every(15 * MIN)
    # Registered at 10:07:23, not on a quarter hour: the grid is the epoch's, not that instant's.
    registered = datetime(2030, 1, 1, 10, 7, 23, tzinfo=timezone.utc)
    due = cadence.first_run(int(registered.timestamp() * 1000))
    assert datetime.fromtimestamp(due / 1000, tz=timezone.utc).time().isoformat() == "10:15:00"
    for lateness in (3_000, 59_000, 1, 14 * MIN):
        due, _ = advance(cadence, due, due + lateness)
        assert datetime.fromtimestamp(due / 1000, tz=timezone.utc).minute in (0, 15, 30, 45)


@pytest.mark.parametrize(
    ("expr", "tz"),
    [
        ("61 * * * *", "UTC"),
        ("* * *", "UTC"),
        ("0 0 31 2 *", "UTC"),
        ("0 9 * * *", "Mars/Olympus"),
        ("@sometimes", "UTC"),
        ("a b c d e", "UTC"),
        ("0 9 * * 8", "UTC"),
    ],
)
def test_an_invalid_cron_or_time_zone_is_refused_with_a_clear_error(expr: str, tz: str) -> None:
    with pytest.raises(ScheduleError):
        Cron(expr, tz)


def test_cron_aliases_expand() -> None:
    start = int(datetime(2030, 1, 1, 10, 30, tzinfo=timezone.utc).timestamp() * 1000)
    assert Cron("@hourly").next_after(start) == start + 30 * MIN
    assert Cron("@daily").next_after(start) == start + (13 * 60 + 30) * MIN


def test_day_and_requires_both_restricted_day_fields_as_celery_does() -> None:
    start = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)  # a Tuesday
    either = datetime.fromtimestamp(Cron("0 0 13 * 5").next_after(start) / 1000, tz=timezone.utc)
    both = datetime.fromtimestamp(
        Cron("0 0 13 * 5", day_and=True).next_after(start) / 1000, tz=timezone.utc
    )
    assert either == datetime(2030, 1, 4, tzinfo=timezone.utc)  # the first Friday
    assert both == datetime(2030, 9, 13, tzinfo=timezone.utc)  # the first Friday the 13th


ZONES = ["Europe/Paris", "America/New_York", "Australia/Lord_Howe"]
EXPRESSIONS = [
    "30 2 * * *",  # fixed, inside the Paris/New York gap and repeat
    "0 2 * * *",  # fixed, at the edge of the gap
    "15,45 1-3 * * *",  # fixed, several slots around the transition
    "45 1 * * *",  # fixed, inside Lord Howe's half-hour repeat (01:30-02:00)
    "*/15 * * * *",  # elapsed time
    "0 */2 * * *",  # elapsed time, stepped hours
    "30 1 * * 1-5",  # fixed, weekdays
    "0 3 1,15 * 0",  # fixed, day-of-month OR day-of-week
]


def _windows(tz: str) -> list[tuple[datetime, datetime]]:
    return [
        (t - timedelta(days=2), t + timedelta(days=2))
        for year in (2025, 2026, 2027)
        for t in transitions(tz, year)
    ]


def _ours(expr: str, tz: str, start: datetime, end: datetime) -> list[int]:
    cadence, at, out = Cron(expr, tz), int(start.timestamp() * 1000), []
    end_ms = int(end.timestamp() * 1000)
    while (at := cadence.next_after(at)) <= end_ms:
        out.append(at)
    return out


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_cron_matches_the_dst_oracle_around_every_transition_of_three_years(
    expr: str, tz: str
) -> None:
    windows = _windows(tz)
    assert len(windows) == 6  # two transitions a year in each of these zones
    for start, end in windows:
        assert _ours(expr, tz, start, end) == Oracle(expr, tz).fires(start, end), (expr, tz, start)


def test_a_fixed_time_in_the_spring_gap_fires_once_at_the_first_valid_instant() -> None:
    start = datetime(2026, 3, 28, 12, tzinfo=timezone.utc)
    fires = _ours("30 2 * * *", "Europe/Paris", start, start + timedelta(days=2))
    # 02:30 does not exist on 29 March in Paris: 03:00 CEST (01:00 UTC) is the first valid instant.
    assert fires[0] == int(datetime(2026, 3, 29, 1, 0, tzinfo=timezone.utc).timestamp() * 1000)
    assert fires[1] == int(datetime(2026, 3, 30, 0, 30, tzinfo=timezone.utc).timestamp() * 1000)


def test_a_fixed_time_repeated_at_fall_back_fires_once() -> None:
    start = datetime(2026, 10, 31, 12, tzinfo=timezone.utc)
    fires = _ours("30 1 * * *", "America/New_York", start, start + timedelta(days=2))
    assert fires == [
        int(
            datetime(2026, 11, 1, 5, 30, tzinfo=timezone.utc).timestamp() * 1000
        ),  # 01:30 EDT, once
        int(datetime(2026, 11, 2, 6, 30, tzinfo=timezone.utc).timestamp() * 1000),
    ]


def test_lord_howe_half_hour_shift_puts_a_gap_time_at_the_end_of_the_gap() -> None:
    # Lord Howe springs forward from 02:00 to 02:30 on 4 October 2026.
    start = datetime(2026, 10, 3, 0, tzinfo=timezone.utc)
    fires = _ours("15 2 * * *", "Australia/Lord_Howe", start, start + timedelta(days=2))
    first = datetime.fromtimestamp(fires[0] / 1000, tz=timezone.utc).astimezone(
        ZoneInfo("Australia/Lord_Howe")
    )
    assert (first.hour, first.minute) == (2, 30)


def test_croniter_is_rejected_because_it_fires_a_repeated_fixed_time_twice() -> None:
    """The evidence behind choosing cronsim: croniter departs from the DST rule."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("Europe/Paris")
    start = datetime(2026, 10, 24, 12, tzinfo=zone)
    end = start + timedelta(days=2)
    it = croniter.croniter("30 2 * * *", start)
    theirs = []
    while (at := it.get_next(datetime)) <= end:
        theirs.append(int(at.timestamp() * 1000))
    expected = Oracle("30 2 * * *", "Europe/Paris").fires(start, end)
    assert _ours("30 2 * * *", "Europe/Paris", start, end) == expected
    assert len(theirs) == len(expected) + 1  # croniter fires 02:30 CEST and 02:30 CET


@given(st.integers(0, 3 * 366 * 24 * 60), st.sampled_from(ZONES), st.sampled_from(EXPRESSIONS))
def test_next_after_is_strictly_later_and_agrees_with_the_oracle_anywhere(
    minute: int, tz: str, expr: str
) -> None:
    start = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=minute, seconds=17)
    got = Cron(expr, tz).next_after(int(start.timestamp() * 1000))
    assert got > start.timestamp() * 1000
    window_end = start + timedelta(days=8)
    assert got == Oracle(expr, tz).fires(start, window_end)[0]


def test_next_runs_previews_a_cron_in_order() -> None:
    start = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    runs = next_runs(Cron("0 9 * * 1", "Europe/Paris"), start, 3)
    assert [datetime.fromtimestamp(r / 1000, tz=timezone.utc).day for r in runs] == [7, 14, 21]
    assert runs == sorted(runs)


def test_a_cron_expression_longer_than_the_limit_is_refused_in_one_short_line() -> None:
    from emq_bridge.cadence import MAX_CRON_CHARS

    longest = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23 * * * *"
    Cron(longest)  # a long but real expression is fine
    huge = ",".join(["0"] * 300_000) + " * * * *"  # ~586 KiB, as a fault run once sent
    with pytest.raises(ScheduleError) as refused:
        Cron(huge)
    assert str(refused.value) == (
        f"cron expression is {len(huge)} characters; the limit is {MAX_CRON_CHARS}"
    )


@pytest.mark.parametrize(
    ("huge", "says"), [(10**400, "at most 1000 years"), (-(10**400), "at least 1 ms")]
)
def test_every_of_an_integer_past_any_float_is_a_schedule_error(huge: int, says: str) -> None:
    # It raised OverflowError (int too large to convert to float) from math.isfinite.
    with pytest.raises(ScheduleError, match=says):
        parse_every(huge)


def test_hourly_crons_in_a_half_hour_dst_zone_stall_and_double_as_design_md_says() -> None:
    # Lord Howe moves its clocks by 30 minutes: the every-hour expressions follow wall time.
    zone = ZoneInfo("Australia/Lord_Howe")

    def runs(expr: str, start: datetime, n: int) -> list[int]:
        at, out = int(start.timestamp() * 1000), []
        for _ in range(n):
            at = Cron(expr, "Australia/Lord_Howe").next_after(at)
            out.append(at)
        return out

    spring = runs("0 * * * *", datetime(2026, 10, 4, 0, 30, tzinfo=zone), 2)
    assert [datetime.fromtimestamp(t / 1000, zone).hour for t in spring] == [1, 3]
    assert spring[1] - spring[0] == 90 * 60_000
    fall = runs("30 * * * *", datetime(2026, 4, 5, 1, 0, tzinfo=zone), 2)
    assert [datetime.fromtimestamp(t / 1000, zone).strftime("%H:%M") for t in fall] == [
        "01:30",
        "01:30",
    ]
    assert fall[1] - fall[0] == 30 * 60_000
