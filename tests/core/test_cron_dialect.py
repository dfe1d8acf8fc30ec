"""The cron dialect: seconds as a sixth field, cronsim's L / LW / 5L / 1#2, Jenkins' H, the
size bound; held against brute-force oracles (no cron library), across DST."""

from __future__ import annotations

import calendar
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from cron_oracle import transitions

from emq_bridge import ConfigError, Cron, Repeat, ScheduleError
from emq_bridge.cadence import MAX_CRON_CHARS
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file
from emq_bridge.definition import Schedule, define

UTC = timezone.utc


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def walk(cron: Cron, start: datetime, end: datetime) -> list[int]:
    out, at = [], ms(start)
    while (at := cron.next_after(at)) <= ms(end):
        out.append(at)
    return out


def seconds_oracle(
    seconds: set[int], minutes: set[int], hours: set[int], tz: str, start: datetime, end: datetime
) -> list[int]:
    """The firing instants in (start, end] by the DST rule of docs/design.md, brute force:
    an elapsed-time expression (minute or hour `*`) fires at every UTC second whose wall time
    matches; a fixed time fires once per matching wall time, at its first instant, or where
    the gap that skips it ends."""
    zone = ZoneInfo(tz)
    if len(minutes) == 60 or len(hours) == 24:
        out, at = [], start + timedelta(seconds=1)
        while at <= end:
            wall = at.astimezone(zone)
            if wall.second in seconds and wall.minute in minutes and wall.hour in hours:
                out.append(ms(at))
            at += timedelta(seconds=1)
        return out
    found: set[int] = set()
    day = start.astimezone(zone).date() - timedelta(days=1)
    while day <= end.astimezone(zone).date() + timedelta(days=1):
        for h in hours:
            for m in minutes:
                for sec in seconds:
                    naive = datetime(day.year, day.month, day.day, h, m, sec)
                    first = naive.replace(tzinfo=zone, fold=0)
                    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != naive:
                        first = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
                        while first.astimezone(zone).replace(tzinfo=None) < naive:
                            first += timedelta(seconds=1)
                    if start < first <= end:
                        found.add(ms(first))
        day += timedelta(days=1)
    return sorted(found)


ZONES = ["Europe/Paris", "America/New_York", "Australia/Lord_Howe"]


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize(
    ("expr", "seconds", "minutes", "hours"),
    [
        ("*/30 * * * * *", {0, 30}, set(range(60)), set(range(24))),
        ("15 30 * * * *", {15}, {30}, set(range(24))),
        ("10,40 30 2 * * *", {10, 40}, {30}, {2}),  # a fixed time: in the gap, and repeated
        ("0 0 1 * * *", {0}, {0}, {1}),
    ],
)
def test_six_fields_match_a_per_second_oracle_around_dst_transitions(
    tz: str, expr: str, seconds: set[int], minutes: set[int], hours: set[int]
) -> None:
    cron = Cron(expr, tz)
    for moment in transitions(tz, 2026):
        # Within the hours a shift reaches on both sides (a seconds cron is costly to walk).
        start, end = moment - timedelta(minutes=70), moment + timedelta(minutes=70)
        assert walk(cron, start, end) == seconds_oracle(seconds, minutes, hours, tz, start, end)


def day_oracle(tz: str, matches: object, start: date, end: date) -> list[int]:
    zone = ZoneInfo(tz)
    out, day = [], start
    while day <= end:
        if matches(day):  # type: ignore[operator]
            out.append(ms(datetime(day.year, day.month, day.day, 9, tzinfo=zone)))
        day += timedelta(days=1)
    return out


def last_weekday(day: date) -> bool:
    last = calendar.monthrange(day.year, day.month)[1]
    days = [date(day.year, day.month, d) for d in range(last - 6, last + 1)]
    return day == max(d for d in days if d.weekday() < 5)


@pytest.mark.parametrize(
    ("expr", "matches"),
    [
        ("0 9 L * *", lambda d: d.day == calendar.monthrange(d.year, d.month)[1]),
        ("0 9 LW * *", last_weekday),
        ("0 9 * * 5L", lambda d: d.weekday() == 4 and (d + timedelta(days=7)).month != d.month),
        ("0 9 * * 1#2", lambda d: d.weekday() == 0 and 8 <= d.day <= 14),
        ("0 0 9 * * 1#2", lambda d: d.weekday() == 0 and 8 <= d.day <= 14),  # 6 fields
    ],
)
def test_cronsims_l_lw_last_weekday_and_nth_weekday_match_a_calendar_oracle(
    expr: str, matches: object
) -> None:
    tz = "Europe/Paris"
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 12, 31, tzinfo=UTC)
    assert walk(Cron(expr, tz), start, end) == day_oracle(
        tz, matches, date(2026, 1, 1), date(2027, 12, 30)
    )


def test_h_is_one_value_per_name_in_the_fields_range_the_same_everywhere() -> None:
    minutes = {Cron("H * * * *", seed=f"job-{i}").resolved.split()[0] for i in range(200)}
    assert all(0 <= int(m) <= 59 for m in minutes)
    assert len(minutes) > 40  # 200 names spread over the hour, not all at :00
    assert Cron("H H * * *", seed="a").resolved == Cron("H H * * *", seed="a").resolved
    assert Cron("H(0-5) * * * *", seed="a").resolved.split()[0] in {str(v) for v in range(6)}
    first, step = Cron("H/15 * * * *", seed="a").resolved.split()[0].split("/")
    assert step == "15" and int(first.split("-")[0]) < 15
    day = int(Cron("0 0 H * *", seed="b").resolved.split()[2])
    assert 1 <= day <= 28  # every month has it
    six = Cron("H H * * * *", seed="c").resolved.split()
    assert 0 <= int(six[0]) <= 59 and 0 <= int(six[1]) <= 59
    assert Cron("0 9 * * MON-THU", seed="x").resolved == "0 9 * * MON-THU"  # THU is no H


def test_h_follows_the_registration_name_through_every_surface(
    tmp_path: Path, repeat: Repeat, redis_url: str, prefix: str
) -> None:
    declared = Schedule(cron="H 3 * * *", name="nightly").bind("app.nightly", "reports")
    assert declared.definition.to_fields()["seed"] == "nightly"
    other = Schedule(cron="H 3 * * *", name="weekly").bind("app.nightly", "reports")
    assert other.definition.to_fields()["seed"] == "weekly"
    assert other.definition.digest != declared.definition.digest  # each resolves its own H
    path = tmp_path / "s.toml"
    path.write_text('queue = "q"\n[[schedule]]\nname = "nightly"\ntask = "t"\ncron = "H 3 * * *"\n')
    (loaded,) = load_schedule_file(path).declarations
    resolved = declared.definition.cadence.resolved  # type: ignore[attr-defined]
    assert loaded.definition.cadence.resolved == resolved  # type: ignore[attr-defined]
    repeat.upsert("q", "nightly", cron="H 3 * * *")  # the API seeds it with the name too
    stored = repeat.get("q", "nightly")
    assert stored is not None
    assert stored.definition.cadence.resolved == resolved  # type: ignore[attr-defined]
    result = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "add",
            "cli",
            "nightly",
            "--task",
            "t",
            "--cron",
            "H 3 * * *",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    added = repeat.get("cli", "nightly")
    assert added is not None
    assert added.definition.cadence.resolved == resolved  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "expr",
    [
        "H(5-70) * * * *",
        "H/0 * * * *",
        "Hx * * * *",
        "H(9-3) * * * *",
        "60 * * * * *",
        "* * * * * * *",
        "0 9 15W * *",  # W beyond LW: cronsim has none
        "0 9 * * 8L",
        "0 9 * * 1#6",
        "x" * (MAX_CRON_CHARS + 1),
    ],
)
def test_a_bad_dialect_is_one_clear_error_and_nothing_is_written(
    expr: str, repeat: Repeat, tmp_path: Path, redis_url: str, prefix: str
) -> None:
    with pytest.raises(ScheduleError) as raised:
        define(cron=expr)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300
    with pytest.raises(ScheduleError):
        repeat.upsert("q", "bad", cron=expr)
    path = tmp_path / "s.toml"
    path.write_text(f'queue = "q"\n[[schedule]]\nname = "bad"\ntask = "t"\ncron = "{expr}"\n')
    with pytest.raises(ConfigError, match="field 'cron'"):
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
            expr,
        ],
    )
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert repeat.names("q") == []


def test_a_sub_minute_cron_fires_through_the_cli_and_a_pump(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    from emq_bridge import Pump
    from emq_bridge.testing import RecordingDispatcher

    result = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "add",
            "cli",
            "fast",
            "--task",
            "t",
            "--cron",
            "*/15 * * * * *",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "cron */15 * * * * *" in result.output
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    repeat.upsert("q", "fast", cron="*/15 * * * * *", template={"task": "t"}, now_ms=t0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    for second in range(1, 61):
        pump.run_once(t0 + second * 1000)
    assert [o.due_ms - t0 for o in recorder.occurrences] == [15_000, 30_000, 45_000, 60_000]


def test_both_decorators_declare_seconds_and_h_crons_seeded_with_the_task_name(
    redis_url: str, prefix: str
) -> None:
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.celery.declare import app_schedule, recurring
    from emq_bridge.dramatiq.schedule import actor_declarations
    from emq_bridge.dramatiq.schedule import recurring as dramatiq_recurring

    app = Celery("dialect_test", set_as_current=False)

    @recurring(cron="*/10 * * * * *", name="fast")
    @recurring(cron="H H * * *", name="spread")
    @app.task(name="app.work")
    def work() -> None: ...

    celery = {d.name: d.definition for d in app_schedule(app).tasks}
    assert celery["fast"].cadence.next_after(0) == 10_000
    assert celery["spread"].to_fields()["seed"] == "spread"
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dq")

    @dramatiq_recurring(cron="0 H(0-5) * * 1#1")
    @dramatiq.actor(broker=broker, actor_name="monthly")
    def monthly() -> None: ...

    (declared,) = actor_declarations(monthly)
    assert declared.definition.to_fields()["seed"] == "monthly"
    hour = int(declared.definition.cadence.resolved.split()[1])  # type: ignore[attr-defined]
    assert 0 <= hour <= 5


def test_day_and_shows_in_the_description_where_it_changes_which_days_fire() -> None:
    from emq_bridge.cadence import Cron

    assert Cron("0 0 13 * 5", day_and=True).describe() == (
        "cron 0 0 13 * 5 (UTC; day of month and of week both)"
    )
    assert Cron("0 0 13 * 5").describe() == "cron 0 0 13 * 5 (UTC)"
    # One day field unrestricted: AND and OR fire the same days, and nothing is added.
    assert Cron("0 3 * * 1-5", day_and=True).describe() == "cron 0 3 * * 1-5 (UTC)"
    assert Cron("0 0 0 13 * 5", "Europe/Paris", day_and=True).describe() == (
        "cron 0 0 0 13 * 5 (Europe/Paris; day of month and of week both)"
    )
