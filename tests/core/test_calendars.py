"""Calendars: `exclude=` dates, ranges, windows and cron rules in the schedule's zone, and named
calendars shared by several schedules; held against a brute-force walk of wall-clock time
across DST, and through the API, the TOML file, both decorators and the CLI."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from cron_oracle import Oracle, transitions

from emq_bridge import ConfigError, Cron, Pump, Repeat, ScheduleError
from emq_bridge.cadence import NEVER_MS
from emq_bridge.calendars import Calendar, Excluding
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file, sync_file
from emq_bridge.definition import Schedule, define
from emq_bridge.events import PumpEvents
from emq_bridge.testing import RecordingDispatcher

UTC = timezone.utc
# Three of the docs' zones, and one that changed its rules recently: Mexico abolished DST
# in 2022 (its last fall-back, 30 October 2022), so 2022 has transitions and 2023 none.
ZONES = [
    ("Europe/Paris", 2026),
    ("America/New_York", 2026),
    ("Australia/Lord_Howe", 2026),
    ("America/Mexico_City", 2022),
]


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def excluded_oracle(
    instant_ms: int, tz: str, days: set[date], window: tuple[datetime, datetime]
) -> bool:
    """Plain comparisons of the slot's wall time: a listed day, a wall-time window (end
    excluded), or a Sunday (the `cron:* * * * 0` rule)."""
    wall = datetime.fromtimestamp(instant_ms / 1000, tz=UTC).astimezone(ZoneInfo(tz))
    naive = wall.replace(tzinfo=None)
    return wall.date() in days or window[0] <= naive < window[1] or wall.isoweekday() == 7


@pytest.mark.parametrize(("tz", "year"), ZONES)
@pytest.mark.parametrize("expr", ["30 2 * * *", "*/30 * * * *", "0 9 * * 1-5"])
def test_exclusions_match_a_wall_clock_oracle_across_dst(tz: str, year: int, expr: str) -> None:
    zone = ZoneInfo(tz)
    for moment in transitions(tz, year):
        local = moment.astimezone(zone)
        # The day after the transition is a holiday, and a window of wall time covers the
        # hours the clock changes on the day of the transition (its gap or its repeated hour).
        holiday = local.date() + timedelta(days=1)
        window = (
            datetime.combine(local.date(), datetime.min.time()) + timedelta(hours=1),
            datetime.combine(local.date(), datetime.min.time()) + timedelta(hours=3, minutes=30),
        )
        rules = (
            holiday.isoformat(),
            f"{window[0].isoformat(timespec='minutes')}..{window[1].isoformat(timespec='minutes')}",
            "cron:* * * * 0",
        )
        cadence = Excluding(Cron(expr, tz), rules, tz)
        start, end = moment - timedelta(days=2), moment + timedelta(days=3)
        base = Oracle(expr, tz).fires(start, end)
        expected = [t for t in base if not excluded_oracle(t, tz, {holiday}, window)]
        got, at = [], ms(start)
        while (at := cadence.next_after(at)) <= ms(end):
            got.append(at)
        assert got == expected, (tz, expr, moment)


@pytest.mark.parametrize(("tz", "year"), ZONES)
@pytest.mark.parametrize("expr", ["*/15 * * * *", "30 2 * * *", "0 * * * *"])
def test_a_window_ending_inside_the_clock_change_ends_where_its_wall_time_first_comes(
    tz: str, year: int, expr: str
) -> None:
    # Paris, 2027-03-28, 01:00..02:30: 02:30 does not exist (02:00 jumps to 03:00), so the
    # first instant whose clock reads 02:30 or later is the transition, 03:00 CEST; 03:00
    # and 03:15 fire. At fall-back the window's end is the first time the clock reads it.
    zone = ZoneInfo(tz)
    for moment in transitions(tz, year):
        before = (moment - timedelta(seconds=1)).astimezone(zone).replace(tzinfo=None)
        after = moment.astimezone(zone).replace(tzinfo=None)
        inside = min(before, after) + abs(after - before) / 2  # a wall time the change moves
        window = (inside - timedelta(hours=2), inside.replace(second=0, microsecond=0))
        rule = "..".join(w.isoformat(timespec="minutes") for w in window)
        cadence = Excluding(Cron(expr, tz), (rule,), tz)
        start, end = moment - timedelta(hours=6), moment + timedelta(hours=6)
        expected = [
            t
            for t in Oracle(expr, tz).fires(start, end)
            if not window[0]
            <= datetime.fromtimestamp(t / 1000, tz=UTC).astimezone(zone).replace(tzinfo=None)
            < window[1]
        ]
        got, at = [], ms(start)
        while (at := cadence.next_after(at)) <= ms(end):
            got.append(at)
        assert got == expected, (tz, expr, moment, rule)


def test_a_range_of_days_and_a_whole_year_skip_in_one_search() -> None:
    cadence = Excluding(
        Cron("* * * * *", "Europe/Paris"), ("2026-12-20..2027-01-03",), "Europe/Paris"
    )
    before = ms(datetime(2026, 12, 19, 22, 59, tzinfo=UTC))
    first = cadence.next_after(before)
    assert first == ms(datetime(2027, 1, 3, 23, 0, tzinfo=UTC))  # 2027-01-04 00:00 Paris


def test_an_exclusion_that_covers_every_slot_is_refused_and_nothing_is_written(
    repeat: Repeat,
) -> None:
    definition = define(every="1m", exclude=["cron:* * * * *"], template={"task": "t"})
    with pytest.raises(ScheduleError, match=r"cover every run from .* to the end of year 9999"):
        repeat.upsert("q", "never", definition=definition)
    assert repeat.names("q") == []


@pytest.mark.parametrize(
    "rule",
    ["2026-02-30", "2026-12-25..2026-12-20", "tomorrow", "cron:* * *", "cron:61 * * * *", "@nope"],
)
def test_a_bad_rule_is_one_clear_error_and_nothing_is_written(
    rule: str, repeat: Repeat, tmp_path: Path, redis_url: str, prefix: str
) -> None:
    with pytest.raises(ScheduleError) as raised:
        define(cron="0 9 * * *", exclude=[rule])
    assert "\n" not in str(raised.value)
    with pytest.raises(ScheduleError):
        repeat.upsert("q", "bad", definition=define(cron="0 9 * * *", exclude=[rule]))
    path = tmp_path / "s.toml"
    path.write_text(
        f'queue = "q"\n[[schedule]]\nname = "bad"\ntask = "t"\ncron = "0 9 * * *"\n'
        f'exclude = ["{rule}"]\n'
    )
    with pytest.raises(ConfigError, match="field 'exclude'"):
        load_schedule_file(path)
    result = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "add",
            "q",
            "bad",
            "--task",
            "t",
            "--cron",
            "0 9 * * *",
            "--exclude",
            rule,
        ],
    )
    assert result.exit_code == 1, result.output
    assert repeat.names("q") == []


CALENDAR_FILE = """
queue = "reports"
[calendars]
holidays = ["2026-12-25", "2027-01-01"]

[[schedule]]
name = "daily"
task = "app.daily"
cron = "0 9 * * *"
tz = "Europe/Paris"
exclude = ["@holidays"]

[[schedule]]
name = "digest"
task = "app.digest"
every = "6h"
exclude = ["@holidays", "cron:* * * * 0,6"]
"""


def test_a_named_calendar_is_shared_and_a_change_to_it_updates_every_schedule_using_it(
    repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(CALENDAR_FILE)
    plan = sync_file(repeat, path)
    assert sorted(d.name for d in plan.create) == ["daily", "digest"]
    daily = repeat.get("reports", "daily")
    assert daily is not None
    assert daily.definition.to_fields()["calendars"] == '["holidays"]'
    again = sync_file(repeat, path)
    assert again.changes == 0  # unchanged: nothing written
    path.write_text(CALENDAR_FILE.replace('"2027-01-01"', '"2027-01-01", "2026-12-31"'))
    changed = sync_file(repeat, path)
    assert sorted(u.name for u in changed.update) == ["daily", "digest"]
    runs = repeat.next_runs("reports", "daily", 400)
    paris = ZoneInfo("Europe/Paris")
    days = {datetime.fromtimestamp(r / 1000, tz=paris).date() for r in runs}
    assert not days & {date(2026, 12, 25), date(2026, 12, 31), date(2027, 1, 1)}


def test_a_pump_never_fires_an_excluded_slot_and_counts_it_as_no_miss(repeat: Repeat) -> None:
    paris = ZoneInfo("Europe/Paris")
    t0 = ms(datetime(2026, 12, 23, 12, tzinfo=paris))
    definition = define(
        cron="0 9 * * *", tz="Europe/Paris", exclude=["2026-12-25"], template={"task": "t"}
    )
    repeat.upsert("q", "daily", definition=definition, now_ms=t0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    for hour in range(1, 5 * 24):
        pump.run_once(t0 + hour * 3_600_000)
    fired = [datetime.fromtimestamp(o.due_ms / 1000, tz=paris).date() for o in recorder.occurrences]
    assert fired == [date(2026, 12, d) for d in (24, 26, 27, 28)]
    record = repeat.get("q", "daily")
    assert record is not None and record.missed == 0


def test_both_decorators_and_the_cli_declare_exclusions_and_next_shows_them(
    repeat: Repeat, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.celery.declare import app_schedule, recurring
    from emq_bridge.dramatiq.schedule import actor_declarations
    from emq_bridge.dramatiq.schedule import recurring as dramatiq_recurring

    holidays = Calendar("holidays", ["2026-12-25"])
    app = Celery("calendars_test", set_as_current=False)

    @recurring(cron="0 9 * * *", exclude=[holidays, "2026-12-31"])
    @app.task(name="app.daily")
    def daily() -> None: ...

    (celery_declared,) = app_schedule(app).tasks
    assert celery_declared.definition.to_fields()["exclude"] == '["2026-12-25", "2026-12-31"]'
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dq")

    @dramatiq_recurring(cron="0 9 * * *", exclude=[holidays])
    @dramatiq.actor(broker=broker, actor_name="daily_actor")
    def daily_actor() -> None: ...

    (dramatiq_declared,) = actor_declarations(daily_actor)
    assert dramatiq_declared.definition.to_fields()["calendars"] == '["holidays"]'
    assert (
        Schedule(cron="0 9 * * *", exclude=[holidays])
        .bind("t", "q")
        .definition.to_fields()["exclude"]
        == '["2026-12-25"]'
    )

    # Real time: `add` and `next` read the server's clock.
    today = datetime.now(UTC).date()
    first, second = today + timedelta(days=2), today + timedelta(days=3)
    calendars = tmp_path / "calendars.toml"
    calendars.write_text(f'[calendars]\nholidays = ["{first}"]\n')
    base = ["--redis-url", redis_url, "--prefix", prefix]
    added = CliRunner().invoke(
        cli,
        [
            *base,
            "add",
            "q",
            "daily",
            "--task",
            "t",
            "--cron",
            "0 9 * * *",
            "--tz",
            "UTC",
            "--exclude",
            "@holidays",
            "--exclude",
            str(second),
            "--calendars",
            str(calendars),
        ],
        catch_exceptions=False,
    )
    assert added.exit_code == 0, added.output
    assert "except calendars holidays" in added.output
    stored = repeat.get("q", "daily")
    assert stored is not None
    assert stored.definition.to_fields()["exclude"] == f'["{first}", "{second}"]'
    # `next` shows the excluded slots where they would have been.
    shown = CliRunner().invoke(
        cli, [*base, "next", "q", "daily", "-n", "3"], catch_exceptions=False
    )
    lines = shown.output.strip().splitlines()
    excluded = {line.split()[0] for line in lines if line.endswith("excluded")}
    runs = {line.split()[0] for line in lines if not line.endswith("excluded")}
    assert excluded == {str(first), str(second)}
    assert len(runs) == 3 and not runs & excluded
    missing = CliRunner().invoke(
        cli,
        [
            *base,
            "add",
            "q",
            "other",
            "--task",
            "t",
            "--cron",
            "0 9 * * *",
            "--exclude",
            "@holidays",
            "--calendars",
            str(tmp_path / "none.toml"),
        ],
    )
    assert missing.exit_code == 1 and "cannot read the calendars" in missing.output


def test_an_exclusion_to_the_end_of_time_is_refused_by_the_api_and_the_cli(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    # Every future slot excluded: refused when written, not registered to never run.
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    definition = define(every="1d", exclude=["2026-01-01..9999-12-31"], template={"task": "t"})
    with pytest.raises(ScheduleError, match="cover every run from 2026-06-02T00:00:00Z to"):
        repeat.upsert("q", "h", definition=definition, now_ms=t0)
    # Two rules that cover everything between them, as one does.
    both = define(every="1h", exclude=["2026-01-01..2027-12-31", "2028-01-01..9999-12-31"])
    with pytest.raises(ScheduleError, match="to the end of year 9999"):
        repeat.upsert("q", "h2", definition=both, now_ms=t0)
    # With start_at ahead, the bounds' own check says it (no run from start_at).
    with pytest.raises(ScheduleError, match="no run from start_at"):
        define(every="1d", start_at="2027-01-01T00:00:00Z", exclude=["2026-06-01..9999-12-31"])
    assert repeat.names("q") == []
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date()
    result = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "add",
            "h",
            "c",
            "--task",
            "t",
            "--every",
            "1d",
            "--exclude",
            f"{yesterday}..9999-12-31",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "to the end of year 9999" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert repeat.names("h") == []


def test_an_exclusion_that_ends_a_running_schedule_leaves_it_no_run_and_no_error() -> None:
    # Registered before its exclusion starts: once there, it has no next run (as past 9999).
    cadence = Excluding(Cron("0 9 * * *", "UTC"), ("2027-01-01..9999-12-31",), "UTC")
    last = ms(datetime(2026, 12, 31, 9, tzinfo=UTC))
    assert cadence.next_after(last - 1) == last
    assert cadence.next_after(last) == NEVER_MS


SUNDAY = datetime(2026, 1, 4, tzinfo=UTC)  # a Sunday


def test_a_six_field_rule_excluding_mondays_does_not_wedge_a_one_second_schedule(
    repeat: Repeat,
) -> None:
    # 86,400 one-second slots on a Monday: the search jumps over the whole day at once,
    # where it used to give up after 20,000 and park the schedule for good.
    definition = define(every="1s", exclude=["cron:* * * * * 1"], template={"task": "t"})
    before = ms(SUNDAY + timedelta(hours=23, minutes=59, seconds=50))
    repeat.upsert("q", "s", definition=definition, now_ms=before)
    recorder = RecordingDispatcher()
    parked: list[str] = []

    class Parks(PumpEvents):
        def on_park(self, queue: str, name: str, reason: str, park_ms: int) -> None:
            parked.append(reason)

    pump = Pump(repeat, ["q"], recorder, listeners=[Parks()])
    monday_end = ms(SUNDAY + timedelta(days=2))
    seconds = [before + k * 1000 for k in range(1, 10)] + [monday_end + k * 1000 for k in range(5)]
    for now in seconds:
        pump.run_once(now)
    assert parked == []
    assert [o.due_ms for o in recorder.occurrences] == seconds
    registration = repeat.get("q", "s")
    assert registration is not None and not registration.paused
    assert registration.next_run_ms == monday_end + 5000


@pytest.mark.parametrize(
    ("every_ms", "rules", "days"),
    [
        (7_000, ("cron:* * * * * 1",), 3),
        (7_000, ("cron:*/10 * 9-17 * * 1-5", "cron:0-29 * * * * 0"), 2),
        (60_000, ("cron:* 22-23,0-1 * * *",), 3),
        (60_000, ("cron:*/2 * * * 1-5", "cron:* 12 * * *"), 3),
        (3_600_000, ("cron:* * * 1-11 *",), 800),
        (3_600_000, ("cron:* * 1-30 * *", "cron:* * * * 5L"), 400),
        (3_600_000, ("cron:* * L * *", "cron:* 9-17 * * 1#2"), 400),
        (3_600_000, ("cron:* * 13 * 5",), 400),
    ],
)
@pytest.mark.parametrize("tz", ["UTC", "Asia/Kolkata"])
def test_excluded_spans_jumped_at_once_match_a_slot_by_slot_oracle(
    every_ms: int, rules: tuple[str, ...], days: int, tz: str
) -> None:
    from cronsim import CronSim

    from emq_bridge.cadence import Every

    zone = ZoneInfo(tz)
    start = ms(SUNDAY)
    end = start + days * 86_400_000
    inner = Every(every_ms)
    cadence = Excluding(inner, rules, tz)

    def excluded(slot: int) -> bool:
        wall = datetime.fromtimestamp(slot / 1000, tz=UTC).astimezone(zone).replace(tzinfo=None)
        for rule in rules:
            expr = rule[5:]
            seconds = len(expr.split()) == 6
            at = wall if seconds else wall.replace(second=0)
            if next(iter(CronSim(expr, at - timedelta(seconds=1)))) == at:
                return True
        return False

    expected, at = [], start
    while (at := inner.next_after(at)) <= end:
        if not excluded(at):
            expected.append(at)
    got, at = [], start
    while (at := cadence.next_after(at)) <= end:
        got.append(at)
    assert got == expected


def test_next_says_excluded_only_of_slots_a_rule_covers(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    from emq_bridge.cadence import Every
    from emq_bridge.cli.calendars import run_notes

    # Explicit instants: from 00:00, a schedule whose first run is 03:00 (its start_at); a
    # window covers 01:00, nothing covers 02:00 (before start_at, no exclusion).
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    hour = 3_600_000
    cadence = Excluding(Every(hour), ("2026-06-01T01:00..2026-06-01T02:00", "2030-01-01"))
    notes = run_notes(cadence, [t0 + 3 * hour, t0 + 4 * hour], t0)
    assert notes == [
        {"excluded_ms": [t0 + hour], "excluded_more": False},
        {"excluded_ms": [], "excluded_more": False},
    ]
    # Several slots of one excluded span are each listed, up to three.
    span = Excluding(Every(hour), ("2026-06-01T01:00..2026-06-01T06:00",))
    (note,) = run_notes(span, [t0 + 6 * hour], t0)
    assert note == {"excluded_ms": [t0 + h * hour for h in (1, 2, 3)], "excluded_more": True}
    # The tester's case, through `next` (the server's clock): start_at 3 h ahead and an
    # unrelated exclusion; nothing is labelled excluded.
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=3)
    definition = define(every="1h", start_at=start, exclude=["2030-01-01"], template={"task": "t"})
    repeat.upsert("q", "later", definition=definition)
    shown = CliRunner().invoke(
        cli,
        ["--redis-url", redis_url, "--prefix", prefix, "next", "q", "later", "-n", "3"],
        catch_exceptions=False,
    )
    assert shown.exit_code == 0, shown.output
    lines = shown.output.strip().splitlines()
    assert len(lines) == 3 and not [line for line in lines if "excluded" in line], lines
