"""Instants at the edges: year 1 and 9999, a partial millisecond, zero offsets and jitters,
huge names in error lines. Whatever is given, a schedule either registers and every surface
shows it, or the answer is one clear error and nothing is written."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from registry_state import snapshot

from emq_bridge import ConfigError, Repeat, ScheduleError, define
from emq_bridge.cadence import LATEST_MS, NEVER_MS, Cron, Every
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file

NOW_MS = 1_893_456_000_000  # 2030-01-01T00:00:00Z
PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ZONES = st.one_of(
    st.sampled_from([timezone.utc, ZoneInfo("Europe/Paris"), ZoneInfo("Pacific/Kiritimati")]),
    st.integers(min_value=-23 * 60, max_value=23 * 60).map(
        lambda minutes: timezone(timedelta(minutes=minutes))
    ),
)
# Any aware datetime Python can hold, weighted toward the edges of its years.
INSTANTS = st.one_of(
    st.datetimes(timezones=ZONES),
    st.datetimes(min_value=datetime(9999, 12, 30), timezones=ZONES),
    st.datetimes(max_value=datetime(1, 1, 2), timezones=ZONES),
    st.datetimes(datetime(1969, 12, 31), datetime(1970, 1, 2), timezones=ZONES),
)
CADENCES: list[dict[str, Any]] = [
    {"every": "1h"},
    {"every": "1h", "anchor": "release"},
    {"cron": "0 0 1 1 *"},
    {"cron": "*/15 * * * *", "tz": "Europe/Paris"},
    {"every": "1h", "exclude": ["9999-12-31", "1970-01-01..1970-01-02"]},
    {
        "cron": "0 0 * * *",
        "tz": "Pacific/Kiritimati",
        "exclude": ["9999-12-31T20:00..9999-12-31T23:59"],
    },
    {"cron": "0 0 1 1 *", "jitter": "30m"},
    {"every": "1d", "jitter": "6h", "exclude": ["cron:* * * * 0"]},
]


def run(redis_url: str, prefix: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args])


@PROPERTY
@given(
    INSTANTS,
    st.sampled_from(["start_at", "end_at", "at"]),
    st.sampled_from(CADENCES),
)
def test_any_instant_either_registers_and_shows_everywhere_or_is_refused_writing_nothing(
    repeat: Repeat, redis_url: str, instant: datetime, field: str, cadence: dict[str, Any]
) -> None:
    name = "edge"
    options = {"at": instant} if field == "at" else {**cadence, field: instant}
    before = snapshot(repeat)
    try:
        definition = define(template={"task": "t"}, **options)
        repeat.register("q", name, definition=definition, now_ms=NOW_MS)
    except ScheduleError as exc:
        assert "\n" not in str(exc)
        assert snapshot(repeat) == before
        return
    try:
        for command in (["list"], ["show", "q", name], ["next", "q", name, "-n", "3"]):
            for output in ([], ["--json"]):
                result = run(redis_url, repeat.prefix, *command, *output)
                assert result.exit_code == 0, (command, result.output)
                if output:
                    json.loads(result.stdout)
    finally:
        repeat.cancel("q", name)


def test_the_edges_of_the_years_are_refused_with_one_clear_error() -> None:
    cases = [
        ({"every": "1h", "start_at": "0001-01-01T00:00+02:00"}, "before 1970 or after 9999"),
        ({"every": "1h", "end_at": "9999-12-31T23:00-02:00"}, "before 1970 or after 9999"),
        ({"at": "9999-12-31T23:30-01:00"}, "before 1970 or after 9999"),
        # no slot from the start to the end of 9999: refused, not registered to never fire
        ({"cron": "0 0 1 1 *", "start_at": "9999-12-31T12:00:00Z"}, "has no run from start_at"),
    ]
    for options, said in cases:
        with pytest.raises(ScheduleError, match=said):
            define(**options)


def test_a_slot_past_9999_is_no_slot_so_next_shows_the_runs_that_exist(
    repeat: Repeat, redis_url: str
) -> None:
    assert Every(3_600_000).next_after(LATEST_MS - 1000) == NEVER_MS
    assert Cron("0 0 1 1 *").next_after(LATEST_MS - 86_400_000) == NEVER_MS
    repeat.register("q", "late", every="1h", start_at="9999-12-31T22:30Z", now_ms=NOW_MS)
    result = run(redis_url, repeat.prefix, "next", "q", "late", "--json")
    assert result.exit_code == 0, result.output
    assert [r["at"] for r in json.loads(result.stdout)] == ["9999-12-31T23:00:00.000+00:00"]


def test_a_start_with_a_partial_millisecond_rounds_up_so_nothing_runs_before_it() -> None:
    start = datetime(2030, 1, 1, 0, 0, 0, 500, tzinfo=timezone.utc)  # 0.5 ms after the second
    released = define(every="1h", anchor="release", start_at=start)
    assert released.bounds.start_ms == NOW_MS + 1
    assert released.first_run(NOW_MS - 10_000) == NOW_MS + 1  # not NOW_MS, before the start
    once = define(at=start)
    assert once.first_run(NOW_MS - 10_000) == NOW_MS + 1
    # An end drops the partial ms: the last run is at or before it.
    assert define(every="1h", end_at=start).bounds.end_ms == NOW_MS


@pytest.mark.parametrize("zero", [0, 0.0, "0", "0s", "0ms", "0.0", "0h0m", timedelta(0)])
def test_zero_offset_and_zero_jitter_mean_none_in_every_form(zero: object) -> None:
    plain = define(every="1h")
    assert define(every="1h", offset=zero) == plain  # type: ignore[arg-type]
    assert define(every="1h", jitter=zero) == plain  # type: ignore[arg-type]


def test_the_cli_takes_a_zero_offset_and_jitter(repeat: Repeat, redis_url: str) -> None:
    result = run(
        redis_url, repeat.prefix, "add", "q", "z", "--task", "t", "--every", "1h",
        "--offset", "0s", "--jitter", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert repeat.get("q", "z").definition.cadence == Every(3_600_000)  # no offset, no jitter


def test_an_error_line_quotes_a_huge_name_or_value_cut(repeat: Repeat, redis_url: str) -> None:
    huge = "a" * 100_000
    for args in (
        ["add", "q", huge, "--task", "t", "--every", "1h"],
        ["add", huge, "x", "--task", "t", "--every", "1h"],
        ["add", "q", f"x y{huge}", "--task", "t", "--every", "1h"],
        ["add", "q", "x", "--task", "t", "--every", huge],
    ):
        result = run(redis_url, repeat.prefix, *args)
        assert result.exit_code == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and len(lines[0]) < 400, lines[0][:500]
    assert snapshot(repeat) == {}


def test_a_file_with_thousands_of_bad_entries_is_one_bounded_error_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    entry = '[[schedule]]\nqueue = "q"\nname = "n{i}"\ntask = "t"\nevery = "never"\n'
    path.write_text("".join(entry.format(i=i) for i in range(5000)))
    with pytest.raises(ConfigError) as caught:
        load_schedule_file(path)
    message = str(caught.value)
    assert message.count("field 'every'") == 20 and message.endswith("and 4980 more")


def test_day_and_on_an_interval_is_refused_for_what_it_is(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[[schedule]]\nqueue = "q"\nname = "n"\ntask = "t"\nevery = "1h"\nday_and = true\n'
    )
    with pytest.raises(
        ConfigError,
        match="field 'day_and': applies to cron schedules only; an interval has no days",
    ):
        load_schedule_file(path)


def test_without_a_start_at_a_schedule_with_no_slot_left_is_taken_with_no_next_run(
    repeat: Repeat,
) -> None:
    # timing.md: refused only when its `start_at` leaves no slot; registered late in 9999
    # without one, it is taken and never fires (session 40's timing probe).
    late = int(datetime(9999, 12, 31, 12, tzinfo=timezone.utc).timestamp() * 1000)
    assert repeat.register("q", "never", every="1d", now_ms=late)
    registration = repeat.get("q", "never")
    assert registration is not None and registration.next_run_ms is None
