"""Input and output a probe found that gave a wrong instant, a traceback or a silent accept.

1. Instants past year 2200 with milliseconds (3000-01-01T00:00:00.001Z) were shown 1 ms
   early by `add`, `show`, `list` and `--json`, and left out of `export`: epoch ms went to
   a `datetime` through a float.
2. `add --calendars FILE` read the file with bare parsers: nesting too deep was a
   traceback, and a JSON key given twice was kept silently (`sync` refuses both).
3. Invalid UTF-8 in `pump --list-key`, `import redbeat --prefix` or the Redis URL (its user
   name, password, `client_name`) reached redis-py, a `UnicodeEncodeError` traceback.
4. A stdout that cannot be written (/dev/full) was a 33-line `OSError` traceback.

Each is now one line on stderr with the documented exit code, and nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from cli_runs import Run, cli_runner, key_count, one_error_line
from registry_state import snapshot

from emq_bridge import ConfigError, Repeat, ScheduleError, define
from emq_bridge.dispatch import ListPushDispatcher

SURROGATE = "\udcff"  # invalid UTF-8 \xff on a command line, as Python decodes argv
AT_3000_MS = 32_503_680_000_001  # 3000-01-01T00:00:00.001Z: no float holds it exactly


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


# -- 1. far-future instants keep their milliseconds ---------------------------------------


def test_add_show_and_list_print_a_far_future_instant_to_the_millisecond(
    run: Run, repeat: Repeat
) -> None:
    added = run("add", "aq", "a", "--task", "t", "--at", "3000-01-01T00:00:00.001Z")
    assert added.exit_code == 0, added.output
    assert "at 3000-01-01T00:00:00.001Z" in added.stdout
    stored = repeat.get("aq", "a")
    assert stored is not None and stored.next_run_ms == AT_3000_MS
    shown = json.loads(run("show", "aq", "a", "--json").stdout)
    assert shown["cadence"] == "at 3000-01-01T00:00:00.001Z"
    assert shown["next_run"] == "3000-01-01T00:00:00.001+00:00"
    assert shown["next_run_ms"] == AT_3000_MS
    assert "at 3000-01-01T00:00:00.001Z" in run("list", "aq").stdout


def test_export_carries_far_future_instants_to_the_millisecond(run: Run) -> None:
    run("add", "aq", "a", "--task", "t", "--at", "3000-01-01T00:00:00.001Z")
    run("add", "aq", "e", "--task", "t", "--every", "1m", "--end-at", "9999-12-31T23:59:59.999Z")
    exported = run("export", "aq", "--format", "json")
    assert exported.exit_code == 0, exported.output
    assert "exported 2 schedule(s), 0 left out" in exported.stderr
    entries = {e["name"]: e for e in json.loads(exported.stdout)["schedule"]}
    assert entries["a"]["at"] == ["3000-01-01T00:00:00.001Z"]
    assert entries["e"]["end_at"] == "9999-12-31T23:59:59.999Z"


# -- 2. add --calendars reads its file as sync reads a schedule file -----------------------


def _deep_calendars(tmp_path: Path, suffix: str) -> Path:
    depth = 100_000  # past any recursion limit (a test run raises it: hypothesis)
    path = tmp_path / f"calendars{suffix}"
    if suffix == ".json":
        path.write_text('{"calendars": {"x": ' + "[" * depth + "]" * depth + "}}")
    else:
        path.write_text("calendars = { x = " + "[" * depth + "]" * depth + " }\n")
    return path


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_add_with_a_calendars_file_nested_too_deeply_exits_1_with_one_line(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path, suffix: str
) -> None:
    path = _deep_calendars(tmp_path, suffix)
    result = run(
        "add", "q", "n", "--task", "t", "--every", "1m", "--exclude", "@x", "--calendars", str(path)
    )
    line = one_error_line(result, 1)
    assert f"{path}: nested too deeply to read" in line
    assert key_count(client, prefix) == 0


def test_add_with_a_calendars_json_key_given_twice_is_refused_as_sync_refuses_it(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "calendars.json"
    path.write_text('{"calendars": {"x": ["2026-12-25"], "x": ["2026-12-24"]}}')
    result = run(
        "add", "q", "n", "--task", "t", "--every", "1m", "--exclude", "@x", "--calendars", str(path)
    )
    line = one_error_line(result, 1)
    assert line == f"Error: {path}: not valid JSON: the key 'x' is given twice in one object"
    assert key_count(client, prefix) == 0


# -- 3. invalid UTF-8 from the command line or the environment -----------------------------


def test_pump_with_a_list_key_that_is_not_utf8_exits_2_with_one_line(
    run: Run, client: redis.Redis, prefix: str, repeat: Repeat
) -> None:
    repeat.register("reports", "n", every="1h", template={"task": "t"})
    repeat.trigger("reports", "n")
    before = snapshot(repeat)
    line = one_error_line(run("pump", "reports", "--list-key", SURROGATE, "--once"), 2)
    assert "'--list-key'" in line and "is not valid UTF-8" in line
    assert snapshot(repeat) == before


def test_a_list_push_dispatcher_refuses_a_key_that_is_not_utf8_at_construction(
    client: redis.Redis,
) -> None:
    with pytest.raises(ScheduleError, match=r"list key '.*' is not valid UTF-8"):
        ListPushDispatcher(client, f"jobs{SURROGATE}")


def test_import_redbeat_with_a_prefix_that_is_not_utf8_exits_2_with_one_line(
    run: Run, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    pytest.importorskip("celery")
    result = run("import", "redbeat", "--from", redis_url, "--prefix", SURROGATE, "--dry-run")
    line = one_error_line(result, 2)
    assert "'--prefix'" in line and "is not valid UTF-8" in line
    assert key_count(client, prefix) == 0


def test_read_redbeat_refuses_a_prefix_that_is_not_utf8_before_reading(client: redis.Redis) -> None:
    pytest.importorskip("celery")
    from emq_bridge.celery.importers.redbeat import importer_app, read_redbeat

    with pytest.raises(ScheduleError, match=r"key prefix '.*' is not valid UTF-8"):
        read_redbeat(client, app=importer_app(), now_ms=0, key_prefix=SURROGATE)


def _with(redis_url: str, userinfo: str = "", query: str = "") -> str:
    parts = urlsplit(redis_url)
    return f"redis://{userinfo}{parts.netloc}{parts.path}{query}"


@pytest.mark.parametrize(
    ("userinfo", "query"),
    [
        ("u:s3cr\udcffet@", ""),  # the password
        ("us\udcffer:s3cret@", ""),  # the user name
        ("", "?client_name=s3cr\udcffet"),
    ],
)
def test_a_redis_url_from_the_environment_that_is_not_utf8_exits_2_with_one_line(
    redis_url: str, prefix: str, userinfo: str, query: str
) -> None:
    """The bytes a shell puts in `REDIS_URL=$'redis://u:\\xff@...'`, through a real process."""
    url = _with(redis_url, userinfo, query)
    env = {**os.environb, b"REDIS_URL": os.fsencode(url)}
    command = [sys.executable, "-m", "emq_bridge", "--prefix", prefix, "list"]
    done = subprocess.run(command, capture_output=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    assert len(lines) == 1, lines
    assert "invalid Redis URL: it is not valid UTF-8" in lines[0]
    assert b"s3cr" not in done.stderr  # not a byte of the password, nor of the URL


def test_repeat_from_url_refuses_a_url_that_is_not_utf8_with_a_config_error(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="not valid UTF-8") as refused:
        Repeat.from_url(_with(redis_url, "u:s3cr\udcffet@"))
    assert "s3cr" not in str(refused.value)


# -- 4. a stdout that cannot be written --------------------------------------------------

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
CANNOT_WRITE = "Error: cannot write to stdout: No space left on device"


def _to_dev_full(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    with open("/dev/full", "w") as full:
        return subprocess.run([*command, *args], stdout=full, stderr=subprocess.PIPE, timeout=60)


@needs_dev_full
@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["list", "--json"],
        ["show", "q", "n"],
        ["next", "q", "n"],
        ["export"],
        ["--help"],
        ["--version"],
    ],
)
def test_a_command_whose_stdout_cannot_be_written_exits_1_with_one_line(
    redis_url: str, prefix: str, repeat: Repeat, args: list[str]
) -> None:
    repeat.upsert("q", "n", definition=define(every="1h", template={"task": "t"}))
    before = snapshot(repeat)
    done = _to_dev_full(redis_url, prefix, *args)
    assert done.returncode == 1, done.stderr
    assert done.stderr.decode().splitlines() == [CANNOT_WRITE]
    assert snapshot(repeat) == before


@needs_dev_full
def test_add_whose_stdout_cannot_be_written_says_so_after_writing_as_documented(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    done = _to_dev_full(redis_url, prefix, "add", "q", "n", "--task", "t", "--every", "1m")
    assert done.returncode == 1, done.stderr
    assert done.stderr.decode().splitlines() == [CANNOT_WRITE]
    assert repeat.get("q", "n") is not None  # "a command that writes ... has written by then"


@needs_dev_full
def test_sync_whose_stdout_cannot_be_written_ends_with_one_error_line(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text('queue = "q"\n[[schedule]]\nname = "n"\ntask = "t"\nevery = "1m"\n')
    done = _to_dev_full(redis_url, prefix, "sync", str(path))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.decode().splitlines()
    assert lines[-1] == CANNOT_WRITE
    assert not any("Traceback" in line for line in lines), lines
