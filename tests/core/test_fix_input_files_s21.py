"""Input a tester found that hung, gave a traceback or was quietly accepted.

Each case is one line on stderr with the documented exit code (1 bad input, 2 bad usage)
and the registry unchanged: a schedule file or a token file that is not a regular file (a
FIFO, /dev/zero) or is too large, an empty path, a `--bind` host that cannot be encoded or
resolved, exclusions that remove every run of a yearly or leap-day cron, cron steps longer
than their field, and control characters in a task name.

What could hang is run in a real process with a timeout: a hang fails the test, not the run.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner, key_count, one_error_line
from click.testing import CliRunner

from emq_bridge import ConfigError, ScheduleError, config
from emq_bridge.cadence import NEVER_MS, Cron
from emq_bridge.calendars import Excluding, resolve_exclude
from emq_bridge.cli import cli
from emq_bridge.config import declaration_from_entry, load_schedule_file
from emq_bridge.millis import instant_ms

HANG_S = 30  # far more than any of these refusals takes; a read of /dev/zero never ends
NOW_MS = 1_798_761_600_000  # 2027-01-01T00:00:00Z
UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens: a command that got that far exits 3


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def process(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`emq-bridge ARGS` in its own process; TimeoutExpired (a failure) if it hangs."""
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    argv = [os.fsencode(a) for a in [*command, *args]]
    return subprocess.run(argv, capture_output=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


def process_line(done: subprocess.CompletedProcess[bytes], code: int) -> str:
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    return lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    path = tmp_path / "schedules.toml"
    os.mkfifo(path)
    return path


def char_device() -> Path:
    path = Path("/dev/zero")
    if not path.exists():
        pytest.skip("no /dev/zero on this platform")
    return path


# -- 1. files that are not regular files, or too large ------------------------------------


def test_sync_of_dev_zero_or_a_fifo_is_refused_unread_in_one_line(
    redis_url: str, client: redis.Redis, prefix: str, fifo: Path
) -> None:
    found = ((char_device(), "a character device"), (fifo, "a named pipe"))
    for (path, kind), flags in itertools.product(found, ((), ("--dry-run",))):
        line = process_line(process(redis_url, prefix, "sync", *flags, str(path)), 1)
        assert line == (
            f"Error: {path}: cannot read the schedule file: it is {kind}, not a regular file"
        )
    assert key_count(client, prefix) == 0


def test_sync_of_a_directory_is_bad_input_as_any_file_it_cannot_read(
    redis_url: str, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    line = process_line(process(redis_url, prefix, "sync", str(tmp_path)), 1)
    assert line == (
        f"Error: {tmp_path}: cannot read the schedule file: it is a directory, not a regular file"
    )
    assert key_count(client, prefix) == 0


def test_add_with_dev_zero_as_its_calendars_is_refused_unread(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    args = ("add", "q", "z", "--task", "t", "--every", "1h", "--calendars", str(char_device()))
    line = process_line(process(redis_url, prefix, *args), 1)
    assert line == (
        "Error: /dev/zero: cannot read the calendars: it is a character device, not a regular file"
    )
    assert key_count(client, prefix) == 0


def test_pump_with_a_fifo_file_is_refused_before_it_pumps(
    redis_url: str, client: redis.Redis, prefix: str, fifo: Path
) -> None:
    done = process(redis_url, prefix, "pump", "q", "--list-key", "k", "--once", "-f", str(fifo))
    assert "it is a named pipe, not a regular file" in process_line(done, 1)
    assert key_count(client, prefix) == 0


@pytest.mark.timeout(HANG_S)  # in this process: a read of /dev/zero or a FIFO would hang
def test_the_loader_refuses_what_is_not_a_regular_file_and_never_waits_on_a_fifo(
    fifo: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="it is a character device, not a regular file"):
        load_schedule_file(char_device())
    with pytest.raises(ConfigError, match="it is a named pipe, not a regular file"):
        load_schedule_file(fifo)  # no writer: opening it the usual way would wait for one
    with pytest.raises(ConfigError, match="it is a directory, not a regular file"):
        load_schedule_file(tmp_path)


def test_a_schedule_file_over_the_limit_is_refused_without_being_read(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    with path.open("wb") as handle:  # sparse: no disk used
        handle.truncate(config.MAX_SCHEDULE_FILE_BYTES + 1)
    started = time.monotonic()
    line = one_error_line(run("sync", "--dry-run", str(path)), 1)
    assert line == (
        f"Error: {path}: cannot read the schedule file: it holds more than 256 MiB, the limit"
    )
    assert time.monotonic() - started < 10
    assert key_count(client, prefix) == 0


def test_the_bound_holds_for_a_file_that_states_no_size() -> None:
    """A /proc file states 0 bytes; it is read all the same, and bounded all the same."""
    status = Path("/proc/self/status")
    if not status.exists() or status.stat().st_size != 0:
        pytest.skip("no /proc file that states a size of 0")
    assert b"Name:" in config.read_bounded(status, 1 << 20)
    with pytest.raises(OSError, match="it holds more than 10 bytes, the limit"):
        config.read_bounded(status, 10)


def test_the_limit_holds_the_bench_file_of_a_million_schedules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # the repository
    bench = importlib.import_module("bench.realistic_workload")  # a failure, not a skip
    path = tmp_path / "schedules.toml"
    bench.write_toml(path, 10_000)  # about a hundredth of the 1,000,000-entry file
    assert path.stat().st_size * 100 * 1.2 < config.MAX_SCHEDULE_FILE_BYTES
    assert len(load_schedule_file(path).declarations) == 10_000


def test_sync_of_an_empty_path_says_so_instead_of_naming_the_current_directory(
    run: Run, client: redis.Redis, prefix: str
) -> None:
    line = one_error_line(run("sync", ""), 1)
    assert line == "Error: the schedule file's path is empty: give the path of a file"
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize("kind", ["dev zero", "fifo", "too large"])
def test_web_with_a_token_file_that_is_no_token_exits_2_in_one_line(
    kind: str, fifo: Path, tmp_path: Path
) -> None:
    if kind == "dev zero":
        path, reason = char_device(), "it is a character device, not a regular file"
    elif kind == "fifo":
        path, reason = fifo, "it is a named pipe, not a regular file"
    else:
        path, reason = tmp_path / "token.txt", "it holds more than 64 KiB, the limit"
        path.write_bytes(b"a" * (64 * 1024 + 1))
    done = process(UNREACHABLE, "emq", "web", "--token-file", str(path))
    line = process_line(done, 2)
    assert line == (
        f"Error: Invalid value for '--token-file': cannot read {path}: {reason} "
        "(see 'emq-bridge web --help')"
    )


# -- 2. --bind hosts that cannot be encoded or are no address ------------------------------


@pytest.mark.parametrize(
    ("bind", "message"),
    [
        ("127.0.0.1\udcff:80", "the host '127.0.0.1\\udcff' is not an IP address or a host name"),
        ("999.0.0.1:8000", "the host '999.0.0.1' is not an IP address or a host name"),
        ("127.0.0.1\x00:80", "the host '127.0.0.1\\x00' is not an IP address or a host name"),
        ("a b:80", "the host 'a b' is not an IP address or a host name"),
        ("127.0.0.1:" + "9" * 5000, "the port must be between 1 and 65535, not a 5000-digit"),
    ],
    ids=["not utf-8", "no ipv4 address", "nul", "space", "5000-digit port"],
)
def test_web_with_a_bind_host_that_is_no_address_exits_2_before_redis_is_asked(
    bind: str, message: str
) -> None:
    """The URL's server is not there: a bind accepted would exit 3."""
    result = CliRunner().invoke(cli, ["--redis-url", UNREACHABLE, "web", "--bind", bind])
    line = one_error_line(result, 2)
    assert line.startswith("Error: Invalid value for '--bind': ") and message in line
    assert "Traceback" not in result.output


def test_web_with_invalid_utf8_in_bind_on_a_real_command_line_is_one_line() -> None:
    done = process(UNREACHABLE, "emq", "web", "--bind", "127.0.0.1\udcff:80")
    assert "is not an IP address or a host name" in process_line(done, 2)


@pytest.mark.parametrize("bind", ["127.0.0.1:8000", "[::1]:8000", "127.1:8000", "localhost:80"])
def test_web_still_takes_the_addresses_it_took(bind: str) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", UNREACHABLE, "web", "--bind", bind])
    assert result.exit_code == 3, result.output  # past --bind, to the absent Redis


# -- 3. exclusions that remove every run of a cron with few runs ---------------------------


@pytest.mark.parametrize(
    ("cron", "tz"),
    [
        ("0 0 1 1 *", "UTC"),
        ("0 0 29 2 *", "UTC"),
        ("@yearly", "UTC"),
        ("0 0 0 1 1 *", "UTC"),
        ("0 0 1 1 *", "Europe/Paris"),
    ],
)
def test_add_whose_exclusions_remove_every_run_exits_1_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, cron: str, tz: str
) -> None:
    rule = "cron:0 0 29 2 *" if "29" in cron else "cron:0 0 1 1 *"
    result = run("add", "q", "z", "--task", "t", "--cron", cron, "--tz", tz, "--exclude", rule)
    line = one_error_line(result, 1)
    assert "the exclusions cover every run from " in line and "the schedule would never" in line
    assert key_count(client, prefix) == 0


def test_sync_of_a_file_whose_exclusions_remove_every_run_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        'queue = "q"\n[[schedule]]\nname = "ok"\ntask = "t"\nevery = "1h"\n'
        '[[schedule]]\nname = "z"\ntask = "t"\ncron = "0 0 29 2 *"\n'
        'exclude = ["cron:0 0 29 2 *"]\n'
    )
    line = one_error_line(run("sync", str(path)), 1)
    assert "the exclusions cover every run from 2" in line
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize(
    ("rules", "first"),
    [
        (("cron:0 0 1 1 *",), None),
        (("cron:0 0 29 2 *", "2027-01-01..2600-12-31"), None),
        (("2027-01-01", "2028-01-01"), "2029-01-01T00:00:00+00:00"),
        (("2027-01-01..2900-12-31",), "2901-01-01T00:00:00+00:00"),
    ],
)
def test_an_exclusion_of_a_yearly_cron_is_refused_only_when_it_leaves_no_run(
    rules: tuple[str, ...], first: str | None
) -> None:
    cron = Cron("0 0 29 2 *" if "cron:0 0 29 2 *" in rules else "0 0 1 1 *")
    excluding = Excluding(cron, rules)
    if first is None:
        with pytest.raises(ScheduleError, match="the exclusions cover every run from"):
            excluding.first_run(NOW_MS - 1)
        # A running schedule is not refused: it has no next run.
        assert excluding.next_after(NOW_MS - 1) == NEVER_MS
    else:
        assert excluding.first_run(NOW_MS - 1) == instant_ms(datetime.fromisoformat(first))


# -- 5. cron steps longer than their field -------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("*/61 * * * *", "minute field '*/61': the step must be 1 to 60"),
        ("*/99999999999999999999 * * * *", "minute field '*/99999999999999999999': the step"),
        ("0 */25 * * *", "hour field '*/25': the step must be 1 to 24"),
        ("0 0 1/32 * *", "day of month field '1/32': the step must be 1 to 31"),
        ("0 0 * 1-12/13 *", "month field '1-12/13': the step must be 1 to 12"),
        ("0 0 * * */8", "day of week field '*/8': the step must be 1 to 7"),
        ("*/61 * * * * *", "second field '*/61': the step must be 1 to 60"),
        ("0 0,*/61 * * * *", "minute field '*/61': the step must be 1 to 60"),
        ("*/0 * * * *", "minute field '*/0': the step must be 1 to 60"),
    ],
)
def test_a_cron_step_longer_than_its_field_is_refused_as_h_steps_are(
    run: Run, client: redis.Redis, prefix: str, expr: str, message: str
) -> None:
    with pytest.raises(ScheduleError, match="the step must be 1 to"):
        Cron(expr)
    line = one_error_line(run("add", "q", "n", "--task", "t", "--cron", expr), 1)
    assert "field 'cron'" in line and message in line
    with pytest.raises(ScheduleError, match="the step must be 1 to"):
        resolve_exclude([f"cron:{expr}"])
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize(
    "expr",
    ["*/60 * * * *", "*/1 * * * *", "0 */24 * * *", "0 0 */31 * *", "0 0 * * */7", "H/60 * * * *"],
)
def test_steps_within_their_field_are_still_taken(expr: str) -> None:
    Cron(expr, seed="n")
    resolve_exclude([f"cron:{expr}"] if "H" not in expr else [])


# -- 6. control characters in a task name --------------------------------------------------


@pytest.mark.parametrize("task", ["t\x01", "t\x00", "app.\x1b[31mred", "t\u2028x", "t\u200ex"])
def test_add_with_a_control_character_in_the_task_exits_1_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, task: str
) -> None:
    line = one_error_line(run("add", "q", "n", "--task", task, "--every", "1h"), 1)
    assert f"field 'task': task {task!r} must not contain control characters" in line
    assert key_count(client, prefix) == 0


def test_a_json_schedule_file_with_a_nul_in_a_task_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.json"
    entry = {"name": "n", "task": "t\u0000", "every": 60}
    path.write_text(json.dumps({"queue": "q", "schedule": [entry]}))
    line = one_error_line(run("sync", str(path)), 1)
    assert "field 'task': task 't\\x00' must not contain control characters" in line
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize("task", ["app.tasks.send", "app.tâches.envoyer", "tasks:run now"])
def test_task_names_without_control_characters_are_still_taken(task: str) -> None:
    declaration = declaration_from_entry({"queue": "q", "name": "n", "task": task, "every": 60})
    assert declaration.definition.template["task"] == task
