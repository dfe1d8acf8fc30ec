"""Hostile input a tester found that gave tracebacks, a wrong blame or a silent write.

Each case is one line on stderr with the documented exit code (1 bad input, 2 bad usage),
and the registry unchanged: numbers of thousands of digits in a schedule file, invalid
UTF-8 (a lone surrogate, what Python makes of it on a command line) in labels, a pause's
note or author and a task name, non-finite `--heartbeat-ttl`/`--max-sleep`, `list` pages
past any integer Redis takes, and a key given twice in `--kwargs` and its siblings.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from registry_state import snapshot

from emq_bridge import ConfigError, Repeat, ScheduleError, define
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file
from emq_bridge.heartbeat import Heartbeat, heartbeat_ttl_ms
from emq_bridge.labels import check_labels

Run = Callable[..., Result]

DIGITS_5000 = "9" * 5000  # past Python's int-from-text limit (4300 digits)
DIGITS_4000 = "9" * 4000  # readable, but no float holds it
SURROGATE = "\udcff"  # invalid UTF-8 \xff on a command line, as Python decodes argv


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix; a traceback fails."""

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(
            cli, ["--redis-url", redis_url, "--prefix", prefix, *args], catch_exceptions=False
        )

    return invoke


def key_count(client: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))


def one_error_line(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), lines
    assert "Traceback" not in result.output
    return lines[0]


def json_file(tmp_path: Path, entry: str, name: str = "schedules.json") -> Path:
    path = tmp_path / name
    path.write_text('{"queue": "q", "schedule": [{"name": "n", "task": "t", ' + entry + "}]}")
    return path


def toml_file(tmp_path: Path, entry: str) -> Path:
    path = tmp_path / "schedules.toml"
    path.write_text(f'queue = "q"\n[[schedule]]\nname = "n"\ntask = "t"\n{entry}\n')
    return path


# -- 1. numbers of thousands of digits, and a .json file that is not UTF-8 ----------------


@pytest.mark.parametrize(
    "write",
    [
        lambda tmp: json_file(tmp, f'"every": {DIGITS_5000}'),
        lambda tmp: json_file(tmp, f'"every": "1h", "args": [{DIGITS_5000}]'),
        lambda tmp: json_file(tmp, f'"every": "1h", "kwargs": {{"a": -{DIGITS_5000}}}'),
        lambda tmp: toml_file(tmp, f"every = {DIGITS_5000}"),
        lambda tmp: toml_file(tmp, f'every = "1h"\nargs = [{DIGITS_5000}]'),
    ],
    ids=["json every", "json args", "json kwargs", "toml every", "toml args"],
)
def test_sync_of_a_file_with_a_5000_digit_number_exits_1_with_one_line_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path, write: Callable[[Path], Path]
) -> None:
    path = write(tmp_path)
    kind = "JSON" if path.suffix == ".json" else "TOML"
    line = one_error_line(run("sync", str(path)), 1)
    assert f"not valid {kind}: an integer has 5000 digits; the limit is 4300" in line
    assert "set_int_max_str_digits" not in line
    assert key_count(client, prefix) == 0
    with pytest.raises(ConfigError, match=f"not valid {kind}"):
        load_schedule_file(path)


@pytest.mark.parametrize("field", ["every", "offset", "jitter", "catchup_window"])
def test_a_duration_of_4000_digits_is_refused_naming_its_field(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path, field: str
) -> None:
    entry = f'"{field}": {DIGITS_4000}' if field == "every" else f'"every": 60, "{field}": -1'
    path = json_file(tmp_path, entry.replace("-1", DIGITS_4000))
    line = one_error_line(run("sync", str(path)), 1)
    assert f"field {field!r}: is out of range: a 13288-bit integer of seconds" in line
    assert key_count(client, prefix) == 0


def test_a_json_file_that_is_not_utf8_is_reported_as_not_valid_json(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.json"
    path.write_bytes(b'{"queue": "q\xff"}')
    line = one_error_line(run("sync", str(path)), 1)
    assert "not valid JSON: 'utf-8' codec can't decode byte 0xff" in line
    assert "TOML" not in line
    assert key_count(client, prefix) == 0


# -- 2. invalid UTF-8 in labels, a pause's note and author, a task ------------------------


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (f"k=v{SURROGATE}", "label 'k' has a value that is not valid UTF-8"),
        (f"k{SURROGATE}=v", "label key 'k\\udcff' is not valid UTF-8"),
    ],
    ids=["value", "key"],
)
def test_add_with_a_label_that_is_not_utf8_exits_1_with_one_line_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, label: str, message: str
) -> None:
    result = run("add", "q", "n", "--task", "t", "--every", "1h", "--label", label)
    line = one_error_line(result, 1)
    assert f"field 'labels': {message}" in line
    assert key_count(client, prefix) == 0


def test_labels_that_are_not_utf8_are_refused_by_the_api_too(repeat: Repeat) -> None:
    for labels in ({"k": SURROGATE}, {SURROGATE: "v"}):
        with pytest.raises(ScheduleError, match="not valid UTF-8"):
            check_labels(labels)
        with pytest.raises(ScheduleError, match="not valid UTF-8"):
            repeat.upsert("q", "n", definition=define(every="1h", labels=labels))
    assert snapshot(repeat) == {}


def test_sync_of_a_file_with_a_label_that_is_not_utf8_writes_nothing_at_all(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    # A JSON escape makes the lone surrogate; it used to be refused only once the sync had
    # begun writing (`<prefix>:{q}:synced` was created).
    path = json_file(tmp_path, '"every": "1h", "labels": {"k": "\\udfff"}')
    line = one_error_line(run("sync", str(path)), 1)
    assert "field 'labels': label 'k' has a value that is not valid UTF-8" in line
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize(
    "args",
    [
        ["n", "--note", f"why{SURROGATE}"],
        ["n", "--by", f"who{SURROGATE}"],
        ["--all", "--by", f"who{SURROGATE}"],
        ["--source", "s", "--note", f"why{SURROGATE}"],
    ],
    ids=["note", "by", "all", "source"],
)
def test_pause_with_a_note_or_author_that_is_not_utf8_exits_1_and_changes_nothing(
    run: Run, repeat: Repeat, args: list[str]
) -> None:
    repeat.upsert("q", "n", every="1h", template={"task": "t"}, source="s")
    before = snapshot(repeat)
    line = one_error_line(run("pause", "q", *args), 1)
    what = "note" if "--note" in args else "by"
    assert f"pause {what} 'w" in line and "is not valid UTF-8" in line
    assert snapshot(repeat) == before


def test_repeat_pause_refuses_a_note_or_author_that_is_not_utf8_writing_nothing(
    repeat: Repeat,
) -> None:
    repeat.upsert("q", "n", every="1h", template={"task": "t"})
    before = snapshot(repeat)
    with pytest.raises(ScheduleError, match=r"pause note 'why\\udcff' is not valid UTF-8"):
        repeat.pause("q", "n", note=f"why{SURROGATE}")
    with pytest.raises(ScheduleError, match=r"pause by .* is not valid UTF-8"):
        repeat.pause_all("q", by=SURROGATE)
    assert snapshot(repeat) == before
    assert repeat.pause("q", "n", note="mail relay down", by="alice")


def test_invalid_utf8_on_a_real_command_line_is_one_line(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    """The bytes a shell passes for `$'\\xff'`, through a real process and its argv."""
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    for args in (
        ["add", "q", "n", "--task", "t", "--every", "1h", "--label", "k=\udcff"],
        ["add", "q", "n", "--task", "t\udcff", "--every", "1h"],
        ["pause", "q", "n", "--note", "why\udcff"],
    ):
        argv = [os.fsencode(a) for a in [*command, *args]]
        done = subprocess.run(argv, capture_output=True, timeout=60)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        assert len(lines) == 1 and "is not valid UTF-8" in lines[0], lines
    assert key_count(client, prefix) == 0


def test_add_with_a_task_that_is_not_utf8_names_the_task(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    line = one_error_line(run("add", "q", "n", "--task", f"t{SURROGATE}", "--every", "1h"), 1)
    assert "field 'task': task 't\\udcff' is not valid UTF-8" in line
    assert "args/kwargs/options" not in line
    path = tmp_path / "schedules.json"  # the same in a file: a JSON escape
    path.write_text('{"queue": "q", "schedule": [{"name": "n", "task": "t\\udfff", "every": 60}]}')
    line = one_error_line(run("sync", str(path)), 1)
    assert "field 'task': task" in line
    assert key_count(client, prefix) == 0


# -- 3. a heartbeat or a sleep of infinity -------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--heartbeat-ttl", "1e400", "inf is not in the range 0.1<=x<=86400"),
        ("--heartbeat-ttl", "1e300", "is not in the range 0.1<=x<=86400"),
        ("--heartbeat-ttl", "nan", "'nan' is not a number"),
        ("--max-sleep", "1e400", "inf is not in the range 0.01<=x<=3600"),
        ("--max-sleep", "nan", "'nan' is not a number"),
        ("--max-sleep", "-inf", "is not in the range 0.01<=x<=3600"),
        # A lease of 1e23 ms would keep a crashed pump's occurrences from ever being re-sent.
        ("--lease-ms", "99999999999999999999999", "is not in the range 1<=x<=86400000"),
        ("--batch-size", "99999999999999999999999", "is not in the range 1<=x<=100000"),
    ],
)
def test_pump_with_a_non_finite_or_huge_heartbeat_or_sleep_exits_2_with_one_line(
    run: Run, client: redis.Redis, prefix: str, option: str, value: str, message: str
) -> None:
    result = run("pump", "q", "--list-key", f"{prefix}:out", "--once", option, value)
    line = one_error_line(result, 2)
    assert f"Invalid value for '{option}'" in line and message in line
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_heartbeat_refuses_a_non_finite_ttl_or_sleep_with_a_value_error(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        heartbeat_ttl_ms(5.0, bad)
    with pytest.raises(ValueError, match="finite number of seconds"):
        Heartbeat(["q"], max_sleep_s=bad)
    with pytest.raises(ValueError, match="finite number of seconds"):
        Heartbeat(["q"], max_sleep_s=1.0, ttl_s=bad)
    with pytest.raises(ValueError, match="at most 86400s"):
        Heartbeat(["q"], max_sleep_s=1.0, ttl_s=1e300)
    assert Heartbeat(["q"], max_sleep_s=1.0, ttl_s=86_400).ttl_ms == 86_400_000


# -- 4. list pages past any integer Redis takes --------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--limit", "99999999999999999999999"],
        ["--offset", "99999999999999999999999"],
        ["--limit", "1000000001"],
        ["--label", "team=x", "--offset", "9999999999999999999"],
        ["--label", "team=x", "--limit", "9999999999999999999"],
    ],
)
def test_list_with_a_page_past_the_bound_is_bad_usage_not_a_redis_error(
    run: Run, repeat: Repeat, args: list[str]
) -> None:
    repeat.upsert("q", "n", every="1h", template={"task": "t"})
    line = one_error_line(run("list", "q", *args), 2)
    assert "is not in the range 0<=x<=1000000000" in line
    assert "Redis" not in line


def test_list_at_the_page_bound_still_lists(run: Run, repeat: Repeat) -> None:
    repeat.upsert("q", "n", every="1h", template={"task": "t"})
    assert "q      n" in run("list", "q", "--limit", "1000000000").stdout
    for args in (["--offset", "1000000000"], ["--label", "a=b", "--offset", "1000000000"]):
        result = run("list", "q", "--limit", "1000000000", *args)
        assert result.exit_code == 0 and "no schedules" in result.stderr


# -- 7. a key given twice in the CLI's JSON ------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--kwargs", '{"a": 1, "a": 2}'),
        ("--kwargs", '{"a": {"b": 1, "b": 1}}'),
        ("--options", '{"priority": 1, "priority": 9}'),
        ("--args", '[{"x": 1, "x": 2}]'),
    ],
)
def test_add_with_a_key_given_twice_in_its_json_exits_2_with_one_line_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, option: str, value: str
) -> None:
    result = run("add", "q", "n", "--task", "t", "--every", "1h", option, value)
    line = one_error_line(result, 2)
    assert f"Invalid value for '{option}': not JSON: the key" in line
    assert "is given twice in one object" in line
    assert key_count(client, prefix) == 0


def test_add_with_a_5000_digit_number_in_its_json_is_one_line_without_python_advice(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    result = run("add", "q", "n", "--task", "t", "--every", "1h", "--args", f"[{DIGITS_5000}]")
    line = one_error_line(result, 2)
    assert "not JSON: an integer has 5000 digits; the limit is 4300" in line
    assert key_count(client, prefix) == 0


def test_json_file_duplicate_keys_are_still_refused(tmp_path: Path) -> None:
    path = json_file(tmp_path, '"every": "1h", "every": "2h"')
    with pytest.raises(ConfigError, match="not valid JSON: the key 'every' is given twice"):
        load_schedule_file(path)


def test_a_valid_add_still_works(run: Run, repeat: Repeat) -> None:
    result = run(
        "add", "q", "n", "--task", "t", "--every", "1h", "--kwargs", '{"a": 1, "b": 2}',
        "--label", "team=é",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    registration: Any = repeat.get("q", "n")
    assert registration.definition.template["kwargs"] == {"a": 1, "b": 2}
    assert dict(registration.definition.labels) == {"team": "é"}


def test_pump_with_a_heartbeat_shorter_than_its_sleep_writes_nothing_before_refusing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    # Checked once the pump's sleep is known: it was refused after the file was synced.
    schedules = tmp_path / "s.toml"
    schedules.write_text(
        'queue = "q"\n\n[[schedule]]\nname = "a"\ntask = "t"\nevery = "1h"\n', "utf-8"
    )
    result = run(
        "pump", "--file", str(schedules), "--list-key", f"{prefix}:out", "--once",
        "--max-sleep", "60", "--heartbeat-ttl", "1",
    )  # fmt: skip
    line = one_error_line(result, 2)
    assert "would expire while its pump sleeps" in line
    assert key_count(client, prefix) == 0
