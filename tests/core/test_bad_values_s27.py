"""Bad schedule values a probe found that were a traceback, a huge message or a silent accept.

1. A large negative float duration (`every = -1e306`, and `offset`, `jitter`,
   `catchup_window`) overflowed in `round`: an `OverflowError` traceback from `sync`.
2. An anchor, misfire or overlap given as a deeply nested list recursed in its `repr`, and a
   100 KB string was quoted whole in the message.
3. A cron holding a control or Unicode blank (`\\r`, `\\n`, U+2028) was split on it
   and stored with it; `add` printed it raw (a `\\r` rewrites the terminal's line).
4. `tz = "localtime"` (and `posixrules`, `Factory`, `posix/...`, `right/...`) was accepted:
   a file of each host's zone database, so pumps on different hosts fired at different times.

Each is now one short `ScheduleError` line (`sync` and `add`: one stderr line, exit 1) and
nothing written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from cli_runs import Run, cli_runner, key_count, one_error_line

from emq_bridge import Repeat, ScheduleError, define, parse_every
from emq_bridge.cadence import Cron, cadence_from_fields
from emq_bridge.definition import misfire_from_fields, policies_from_fields

SHORT_MESSAGE = 300  # characters: an error is one short line, whatever was given


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def _schedule_file(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "schedules.toml"
    path.write_text(f'queue = "q"\n[[schedule]]\nname = "n"\ntask = "t"\n{lines}\n')
    return path


def _deep_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# -- 1. large negative durations -----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"every": -1e306}, "every"),
        ({"every": -1e300}, "every"),
        ({"every": "1m", "offset": -1e306}, "offset"),
        ({"every": "1m", "jitter": -1e306}, "jitter"),
        ({"every": "1m", "catchup_window": -1e306}, "catchup_window"),
    ],
)
def test_define_refuses_a_huge_negative_duration_with_one_line(
    options: dict[str, Any], what: str
) -> None:
    with pytest.raises(ScheduleError, match=rf"^{what} must be at least 1 ms, got -1e\+30\d"):
        define(**options)


def test_parse_every_refuses_a_huge_negative_number_of_seconds() -> None:
    with pytest.raises(ScheduleError, match=r"^every must be at least 1 ms, got -1e\+306"):
        parse_every(-1e306)
    with pytest.raises(ScheduleError, match="at least 1 ms"):
        parse_every(-0.5)  # a small negative is refused as before


@pytest.mark.parametrize(
    "line",
    [
        "every = -1e306",
        'every = "1m"\njitter = -1e306',
        'every = "1m"\ncatchup_window = -1e306',
        'every = "1m"\noffset = -1e306',
    ],
)
def test_sync_refuses_a_file_with_a_huge_negative_duration_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path, line: str
) -> None:
    path = _schedule_file(tmp_path, line)
    error = one_error_line(run("sync", str(path)), 1)
    assert "must be at least 1 ms" in error, error
    assert key_count(client, prefix) == 0


# -- 2. unprintable policy values ------------------------------------------------------------


@pytest.mark.parametrize("field", ["anchor", "misfire", "overlap"])
def test_a_deeply_nested_policy_value_is_named_by_its_type(field: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        define(every="1m", **{field: _deep_list(100_000)})
    message = str(raised.value)
    assert message.startswith(f"{field} must be one of ") and message.endswith("got list")


@pytest.mark.parametrize("field", ["anchor", "misfire", "overlap"])
def test_a_huge_policy_string_is_quoted_clipped(field: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        define(every="1m", **{field: "x" * 100_000})
    message = str(raised.value)
    assert len(message) < SHORT_MESSAGE and "(100000 characters)" in message, message


def test_a_record_with_a_huge_field_is_refused_with_a_short_message() -> None:
    huge = "x" * 100_000
    for fields in (
        {"every_ms": huge},
        {"every_ms": "60000", "anchor": huge},
        {"every_ms": "60000", "offset_ms": huge},
    ):
        with pytest.raises(ScheduleError) as raised:
            cadence_from_fields(fields)
        assert len(str(raised.value)) < SHORT_MESSAGE
    for read, fields in (
        (misfire_from_fields, {"misfire": huge}),
        (misfire_from_fields, {"catchup_window": huge}),
        (policies_from_fields, {"overlap": huge}),
        (policies_from_fields, {"pause_after_failures": huge}),
    ):
        with pytest.raises(ScheduleError) as raised:
            read(fields)
        assert len(str(raised.value)) < SHORT_MESSAGE


# -- 3. cron expressions hold printable ASCII only -----------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 * * *\r",
        "0 0 * * *\n",
        "0 0 * * *\v",
        "0 0 * * *\f",
        "0\x1c0 * * *",
        "0\x1f0 * * *",
        "0\x850 * * *",
        "0\u20280 * * *",
        "0\u00a00 * * *",
        "@daily\r",
    ],
)
def test_a_cron_with_a_control_or_unicode_blank_is_refused(expr: str) -> None:
    with pytest.raises(ScheduleError, match=r"printable ASCII, its fields separated by spaces"):
        Cron(expr)
    with pytest.raises(ScheduleError) as raised:
        define(cron=expr)
    assert str(raised.value).isprintable(), raised.value


def test_a_cron_with_plain_spaces_or_tabs_is_still_read() -> None:
    assert Cron(" 0  9 * * 1-5 ").resolved == "0 9 * * 1-5"
    assert Cron("0\t9\t* * 1-5").resolved == "0 9 * * 1-5"  # crontab(5) separates so too
    assert Cron("@daily").resolved == "0 0 * * *"


@pytest.mark.parametrize("expr", ["0 0 * * *\r", "0\u20280 * * *"])
def test_add_refuses_a_cron_with_a_control_character_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, expr: str
) -> None:
    error = one_error_line(run("add", "q", "n", "--task", "t", "--cron", expr), 1)
    assert "printable ASCII" in error and error.isprintable(), error
    assert key_count(client, prefix) == 0


def test_sync_refuses_a_file_whose_cron_ends_in_a_carriage_return(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = _schedule_file(tmp_path, 'cron = "0 0 * * *\\r"')
    error = one_error_line(run("sync", str(path)), 1)
    assert "printable ASCII" in error and error.isprintable(), error
    assert key_count(client, prefix) == 0


# -- 4. time zones are IANA names, not files of the host ----------------------------------


HOST_ZONES = ["localtime", "posixrules", "Factory", "LocalTime", "right/UTC", "posix/Europe/Paris"]


@pytest.mark.parametrize("tz", HOST_ZONES)
def test_a_zone_that_is_a_file_of_the_host_is_refused(tz: str) -> None:
    with pytest.raises(ScheduleError, match="not an IANA zone"):
        define(cron="0 9 * * *", tz=tz)


@pytest.mark.parametrize("tz", ["UTC", "Etc/UTC", "Etc/GMT+5", "US/Eastern", "Europe/Paris"])
def test_iana_names_and_their_legacy_links_are_still_read(tz: str) -> None:
    assert define(cron="0 9 * * *", tz=tz).cadence.to_fields()["tz"] == tz


def test_sync_refuses_a_file_in_localtime_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = _schedule_file(tmp_path, 'cron = "0 9 * * *"\ntz = "localtime"')
    error = one_error_line(run("sync", str(path)), 1)
    assert "'localtime'" in error and "not an IANA zone" in error, error
    assert key_count(client, prefix) == 0


def test_add_still_writes_a_schedule_in_a_legacy_zone_link(
    run: Run, repeat: Repeat, prefix: str
) -> None:
    added = run("add", "q", "n", "--task", "t", "--cron", "0 9 * * *", "--tz", "US/Eastern")
    assert added.exit_code == 0, added.output
    stored = repeat.get("q", "n")
    assert stored is not None and stored.definition.cadence.to_fields()["tz"] == "US/Eastern"
