"""Bad schedule arguments are refused in one line that names what is wrong and where
(session 32's argument probe).

Before: `add --args '[NaN]'` (or `Infinity`, or `1e400`, which Python reads as inf) exited 1
saying the field "holds a value JSON cannot carry (dates and times are not allowed): Out of
range float values...", though the docs make arguments that are not JSON bad usage (exit
2), and a schedule file's `nan` said the same; a lone surrogate (`"\\ud800"`) was blamed on
`field 'args/kwargs/options'`; `--args` nested 10,000 levels deep lost the `schedule q/n,`
that 33 levels gets; and `@recurring(name=...)` did not say which schedule was refused.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from processes import run_cli

from emq_bridge import ScheduleError
from emq_bridge.celery import recurring as celery_recurring
from emq_bridge.cli import cli
from emq_bridge.dramatiq import recurring as dramatiq_recurring
from emq_bridge.strict_json import read_json
from emq_bridge.template import MAX_TEMPLATE_DEPTH

Run = Callable[..., Result]

NO_NAN = "JSON has no NaN or infinite numbers"
TOO_DEEP = f"template is nested more than {MAX_TEMPLATE_DEPTH} levels deep"
ADD = ("add", "q", "n", "--task", "t", "--every", "1h")


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


# -- 1. NaN and infinite numbers are not JSON: bad usage, exit 2 -----------------------------


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [
        ("--args", "[NaN]", "NaN: "),
        ("--args", "[1, Infinity]", "Infinity: "),
        ("--args", "[-Infinity]", "-Infinity: "),
        ("--args", "[1e400]", "the number 1e400 is too large for a float"),
        ("--args", "[-1e400]", "the number -1e400 is too large for a float"),
        ("--kwargs", '{"limit": NaN}', "NaN: "),
        ("--kwargs", '{"deep": [[{"x": 1e999}]]}', "the number 1e999 is too large"),
        ("--options", '{"priority": Infinity}', "Infinity: "),
    ],
)
def test_add_with_a_nan_or_infinite_number_is_not_json_exit_2_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, option: str, value: str, shown: str
) -> None:
    line = one_error_line(run(*ADD, option, value), 2)
    assert f"Invalid value for '{option}': not JSON: {shown}" in line, line
    assert NO_NAN in line, line
    assert "dates and times" not in line, line
    assert key_count(client, prefix) == 0


def test_add_with_nan_as_a_process_exits_2_with_one_line(redis_url: str, prefix: str) -> None:
    done = run_cli(redis_url, prefix, *ADD, "--args", "[NaN]")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"not JSON: NaN: {NO_NAN}" in lines[0], lines
    assert done.stdout == ""


def test_finite_numbers_near_the_edges_are_still_taken(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    result = run(*ADD, "--args", "[1e308, -1.7976931348623157e308, 5e-324, 1e-400, -0.0]")
    assert result.exit_code == 0, result.output
    assert key_count(client, prefix) > 0


@pytest.mark.parametrize(
    ("suffix", "entry", "field"),
    [
        (".toml", "args = [1, nan]", "args"),
        (".toml", "kwargs = { limit = inf }", "kwargs"),
        (".toml", "options = { priority = -inf }", "options"),
        (".json", '"args": [NaN]', "args"),
        (".json", '"kwargs": {"a": [1e400]}', "kwargs"),
    ],
)
def test_a_schedule_file_with_a_nan_or_infinite_number_names_the_kind_of_value(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path, suffix: str, entry: str, field: str
) -> None:
    path = tmp_path / f"schedules{suffix}"
    if suffix == ".toml":
        path.write_text(f'queue = "q"\n[[schedule]]\nname = "n"\ntask = "t"\nevery = 60\n{entry}\n')
    else:
        path.write_text(
            f'{{"queue": "q", "schedule": [{{"name": "n", "task": "t", "every": 60, {entry}}}]}}'
        )
    line = one_error_line(run("sync", str(path)), 1)
    expected = f"schedule #1 (q/n), field {field!r}: holds a NaN or infinite number"
    assert expected in line, line
    assert "dates and times" not in line and "Out of range" not in line, line
    assert key_count(client, prefix) == 0


def test_a_date_in_a_file_still_says_dates_are_not_allowed(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        'queue = "q"\n[[schedule]]\nname = "n"\ntask = "t"\nevery = 60\n'
        "args = [1979-05-27T07:32:00Z]\n"
    )
    line = one_error_line(run("sync", str(path)), 1)
    assert "field 'args': holds a value JSON cannot carry (dates and times are not allowed)" in line


# -- 2. a lone surrogate is named in the field that holds it ---------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--args", '["\\ud800"]'),
        ("--args", '[1, {"k": ["a\\udfffb"]}]'),
        ("--kwargs", '{"k": "\\udcff"}'),
        ("--kwargs", '{"\\ud800": 1}'),
        ("--options", '{"headers": {"h": "\\ud800"}}'),
    ],
)
def test_add_with_a_lone_surrogate_names_the_field(
    run: Run, client: redis.Redis, prefix: str, option: str, value: str
) -> None:
    line = one_error_line(run(*ADD, option, value), 1)
    field = option[2:]
    assert f"schedule q/n, field {field!r}: holds a string that is not valid UTF-8" in line, line
    assert "args/kwargs/options" not in line
    assert key_count(client, prefix) == 0


# -- 3. nesting too deep to parse reads as nesting just too deep -----------------------------


def nested_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_object(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    ("option", "nested"),
    [("--args", nested_array), ("--kwargs", nested_object), ("--options", nested_object)],
)
def test_add_nested_past_the_parsers_stack_says_what_33_levels_say(
    run: Run, client: redis.Redis, prefix: str, option: str, nested: Callable[[int], str]
) -> None:
    field = option[2:]
    expected = f"Error: schedule q/n, field {field!r}: {TOO_DEEP}"
    for depth in (MAX_TEMPLATE_DEPTH + 1, 10_000, 60_000):
        assert one_error_line(run(*ADD, option, nested(depth)), 1) == expected, depth
    assert key_count(client, prefix) == 0


def test_add_nested_10000_deep_as_a_process_names_the_schedule(redis_url: str, prefix: str) -> None:
    done = run_cli(redis_url, prefix, *ADD, "--args", nested_array(10_000))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"Error: schedule q/n, field 'args': {TOO_DEEP}"


def test_a_json_schedule_file_keeps_nan_for_the_entry_check_to_name() -> None:
    nan, inf, minus = read_json("[NaN, 1e400, -Infinity]", finite=False)
    assert math.isnan(nan) and inf == math.inf and minus == -math.inf


# -- 5. @recurring names the schedule it refuses ---------------------------------------------


@pytest.mark.parametrize(
    "recurring", [celery_recurring, dramatiq_recurring], ids=["celery", "dramatiq"]
)
@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"args": [float("nan")]}, "template is not JSON-serialisable"),
        ({"kwargs": {"k": float("inf")}}, "template is not JSON-serialisable"),
        ({"args": [{1: "one"}]}, "template keys must be strings"),
        ({"args": "abc"}, "args must be a list or tuple, got str"),
        ({"every": "soon"}, "every 'soon' is not an interval"),
    ],
)
def test_recurring_with_a_name_says_which_schedule_it_refuses(
    recurring: Any, values: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ScheduleError) as raised:
        recurring(**{"every": "1m", "name": "nightly", **values})
    assert str(raised.value).startswith(f"schedule 'nightly': {reason}"), raised.value
    with pytest.raises(ScheduleError) as unnamed:  # no name: the reason alone, as before
        recurring(**{"every": "1m", **values})
    assert str(unnamed.value).startswith(reason), unnamed.value


@pytest.mark.parametrize(
    "recurring", [celery_recurring, dramatiq_recurring], ids=["celery", "dramatiq"]
)
def test_recurring_with_a_bad_name_refuses_the_name_alone(recurring: Any) -> None:
    with pytest.raises(ScheduleError, match=r"^schedule name 'a b' must not contain whitespace"):
        recurring(every="1m", name="a b", args=[float("nan")])


def test_an_app_module_with_a_bad_recurring_names_it_at_import(tmp_path: Path) -> None:
    """As a process: the import fails with the schedule's name in the error."""
    (tmp_path / "badrec.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "from emq_bridge.dramatiq import recurring\n"
        "dramatiq.set_broker(StubBroker())\n"
        "@recurring(every='2s', name='report-nan', args=[float('nan')])\n"
        "@dramatiq.actor(queue_name='dq')\n"
        "def report(x):\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", "import badrec"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("emq_bridge.errors.ScheduleError: schedule 'report-nan': "), last
