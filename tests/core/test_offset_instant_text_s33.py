"""An interval's offset given as an ISO date-time string (what a JSON schedule file and
`add --offset` can hold of the datetime a TOML file gives) was refused as "not an interval",
where `start_at`, `end_at` and `at` take such strings (found by a probe of definition
fidelity, session 33). It is the same offset as the datetime now; a naive one is refused.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from emq_bridge import Repeat, ScheduleError, define
from emq_bridge.cli import cli

AT = "2026-01-01T00:07:00+00:00"


def test_an_iso_instant_offset_is_the_datetime_one() -> None:
    given = define(every="15m", offset=AT, template={"task": "t"})
    expected = define(every="15m", offset=datetime.fromisoformat(AT), template={"task": "t"})
    assert given.digest == expected.digest and given.cadence == expected.cadence
    with pytest.raises(ScheduleError, match="has no time zone"):
        define(every="15m", offset="2026-01-01T00:07:00", template={"task": "t"})
    assert define(every="15m", offset="7m", template={"task": "t"}).cadence == expected.cadence


def test_a_json_file_and_the_command_line_take_it(
    tmp_path: Path, repeat: Repeat, redis_url: str
) -> None:
    base = ["--redis-url", redis_url, "--prefix", repeat.prefix]
    entry = {"queue": "q", "name": "file", "task": "t", "every": "15m", "offset": AT}
    document = tmp_path / "schedules.json"
    document.write_text(json.dumps({"schedule": [entry]}))
    synced = CliRunner().invoke(cli, [*base, "sync", str(document)])
    assert synced.exit_code == 0, synced.output
    added = CliRunner().invoke(
        cli, [*base, "add", "q", "cli", "--task", "t", "--every", "15m", "--offset", AT]
    )
    assert added.exit_code == 0, added.output
    offsets = {n: repeat.get("q", n).definition.cadence for n in ("file", "cli")}  # type: ignore[union-attr]
    expected = define(every="15m", offset=datetime(2026, 1, 1, 0, 7, tzinfo=timezone.utc)).cadence
    assert offsets == {"file": expected, "cli": expected}


def test_a_bare_number_of_seconds_is_rounded_to_the_nearest_ms_a_unit_must_be_whole() -> None:
    # The same probe: `every=1.0005` became 1 s where `"1.0005s"` is refused; both are as
    # schedules-and-cli.md says now (Celery intervals are float seconds: 1/3 s is 333 ms).
    from emq_bridge.cadence import parse_every

    assert [parse_every(v) for v in (1.0005, "1.0005", 1 / 3, 2.5)] == [1000, 1000, 333, 2500]
    with pytest.raises(ScheduleError, match="whole number of ms"):
        parse_every("1.0005s")
