"""Bounds and one-offs through the schedule file and the CLI (`add`, `list`, `show`).

The same oracles as test_timing_oracle.py: epoch-grid slots by walking from 0, instants of
zoned wall times by walking UTC minutes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from cron_oracle import Oracle
from test_timing_oracle import grid_oracle, wall_instant

from emq_bridge import Pump, Repeat
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file, sync_file
from emq_bridge.errors import ConfigError
from emq_bridge.testing import ManualClock, RecordingDispatcher

MIN = 60_000
UTC = timezone.utc
Run = Callable[..., Result]

# Paris changes its clocks on 2030-03-31 (02:00 -> 03:00) and 2030-10-27 (03:00 -> 02:00).
FILE = """
queue = "q"

[[schedule]]
name = "window"
task = "t"
every = "10m"
offset = "5m"
start_at = 2030-03-31T01:10:00+01:00
end_at = 2030-03-31T04:20:00+02:00

[[schedule]]
name = "twice"
task = "t"
at = [2030-10-27T02:30:00+02:00, 2030-10-27T02:30:00+01:00]

[[schedule]]
name = "three"
task = "t"
cron = "0 * * * *"
tz = "Europe/Paris"
start_at = "2030-10-27T01:00:00+02:00"
limit = 3
"""


def fired_by_name(repeat: Repeat, start: int, end: int, step: int) -> dict[str, list[int]]:
    clock = ManualClock(start)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    while clock() <= end:
        pump.run_once()
        clock.advance(step)
    found: dict[str, list[int]] = {}
    for occurrence in recorder.occurrences:
        found.setdefault(occurrence.name, []).append(occurrence.due_ms)
    return {name: sorted(dues) for name, dues in found.items()}


def test_the_schedule_file_bounds_intervals_and_crons_and_fires_one_offs_across_dst(
    repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    sync_file(repeat, path)
    low = wall_instant(datetime(2030, 3, 31, 1, 10), "Europe/Paris")
    high = wall_instant(datetime(2030, 3, 31, 4, 20), "Europe/Paris")
    spring = fired_by_name(repeat, low - 3 * 3_600_000, high + 3_600_000, 3 * MIN)
    assert spring["window"] == grid_oracle(10 * MIN, 5 * MIN, low, high)
    assert set(spring) == {"window"}
    fall = fired_by_name(repeat, low + 200 * 86_400_000, high + 215 * 86_400_000, 20 * MIN)
    twice = [wall_instant(datetime(2030, 10, 27, 2, 30), "Europe/Paris", fold) for fold in (0, 1)]
    assert fall["twice"] == twice
    # Hourly from 01:00 CEST, three runs, by the cron oracle (an hour field `*` follows
    # elapsed time: 02:00 CEST and 02:00 CET both fire).
    first = wall_instant(datetime(2030, 10, 27, 1, 0), "Europe/Paris")
    after = datetime.fromtimestamp(first / 1000 - 1, UTC)
    slots = Oracle("0 * * * *", "Europe/Paris").fires(after, after + timedelta(hours=5))
    assert fall["three"] == slots[:3] == [first, first + 3_600_000, first + 2 * 3_600_000]
    states = {r.name: r.completed for r in repeat.list("q")}
    assert states == {"window": "end_at", "twice": "at", "three": "limit"}
    # Synced again, nothing changes: a completed schedule stays completed.
    again = sync_file(repeat, path)
    assert len(again.unchanged) == 3 and again.changes == 0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('every = "15m"\nend_at = 2030-01-01T10:00:00', "field 'end_at'.*no time zone"),
        ('every = "15m"\nstart_at = 5', "field 'start_at': must be a date-time"),
        ('every = "15m"\nlimit = 0', "field 'limit'"),
        ('every = "15m"\nlimit = true', "field 'limit'"),
        ('cron = "0 9 * * *"\noffset = "5m"', "field 'offset': applies to interval"),
        ('every = "15m"\noffset = "20m"', "field 'offset'.*less than the interval"),
        ("at = [1, 2]", "field 'at'"),
        ("at = 2030-01-01T10:00:00Z\nimmediately = true", "field 'immediately'"),
        ('every = "1h"\nimmediately = "yes"', "field 'immediately'"),
        (
            'every = "1h"\nstart_at = 2030-01-02T00:00:00Z\nend_at = 2030-01-01T00:00:00Z',
            "before start_at",
        ),
    ],
)
def test_bad_bounds_in_the_file_are_errors_naming_the_field(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'[[schedule]]\nqueue = "q"\nname = "n"\ntask = "t"\n{entry}\n')
    with pytest.raises(ConfigError, match=message):
        load_schedule_file(path)


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args], **kwargs)

    return invoke


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def test_cli_add_takes_bounds_and_one_offs_and_list_and_show_say_completed(
    run: Run, repeat: Repeat
) -> None:
    now = repeat.server_time_ms()
    soon = now + 60_000
    added = run("add", "q", "once", "--task", "t", "--at", iso(soon), "--at", iso(soon + MIN))
    assert added.exit_code == 0, added.output
    run("add", "q", "past", "--task", "t", "--at", "2020-01-01T00:00:00Z")
    result = run(
        "add",
        "q",
        "trial",
        "--task",
        "t",
        "--every",
        "15m",
        "--offset",
        "5m",
        "--limit",
        "2",
        "--start-at",
        iso(now),
        "--end-at",
        iso(now + 30 * 86_400_000),
        "--immediately",
    )
    assert result.exit_code == 0, result.output
    trial = repeat.get("q", "trial")
    assert trial is not None and trial.definition.bounds.limit == 2
    assert trial.definition.to_fields()["offset_ms"] == str(5 * MIN)
    shown = run("show", "q", "trial").output
    assert "  limit     2 runs, 2 remaining" in shown
    assert "start at" in shown and "end at" in shown
    # Fire everything due within an hour: `once` twice, `trial` immediately and then once.
    fired = fired_by_name(repeat, now, now + 3_600_000, MIN)
    assert fired["once"] == [soon, soon + MIN]
    assert len(fired["trial"]) == 2 and "past" not in fired
    listed = run("list", "q").output
    rows = {line.split()[1]: line for line in listed.splitlines()[1:]}
    assert "completed: its last at instant has passed" in rows["once"]
    assert "completed: its last at instant has passed" in rows["past"]
    assert "completed: its limit of runs is reached" in rows["trial"]
    shown = run("show", "q", "trial").output
    assert "  state     completed: its limit of runs is reached" in shown
    assert "  next run  - (completed)" in shown
    assert "2 runs, 0 remaining" in shown
    data = json.loads(run("show", "q", "once", "--json").output)
    assert (data["state"], data["completed"], data["kind"]) == ("completed", "at", "at")
    assert data["at_ms"] == [soon, soon + MIN]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--every", "15m", "--end-at", "2030-01-01T10:00:00"], "no time zone"),
        (["--every", "15m", "--start-at", "tomorrow"], "not an ISO 8601"),
        (["--cron", "0 9 * * *", "--offset", "5m"], "applies to interval"),
        (["--every", "15m", "--at", "2030-01-01T10:00:00Z"], "give only one of"),
        (["--at", "2030-03-31T02:30:00+01:00", "--immediately"], "immediately"),
    ],
)
def test_cli_add_with_bad_bounds_exits_1_with_one_line_and_writes_nothing(
    run: Run, repeat: Repeat, args: list[str], message: str
) -> None:
    result = run("add", "q", "bad", "--task", "t", *args)
    assert result.exit_code == 1, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert repeat.get("q", "bad") is None


def test_a_day_long_window_is_listed_with_its_bounds_in_words(run: Run, repeat: Repeat) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    repeat.register(
        "q",
        "w",
        every="1h",
        start_at=start,
        end_at=start + timedelta(days=1),
        limit=5,
        template={"task": "t"},
    )
    assert (
        "every 1h (from 2030-01-01T00:00:00Z, until 2030-01-02T00:00:00Z, 5 runs)"
        in run("list", "q").output
    )
