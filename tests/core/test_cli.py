"""Every `emq-bridge` command, in-process with click's CliRunner, against a real server."""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from quiet import quiet_offset
from registry_state import snapshot

from emq_bridge import Every, Repeat, define, occurrence_id
from emq_bridge.cli import cli
from emq_bridge.cli.context import redact_url

Run = Callable[..., Result]

HEAD = 'source = "ops"\nqueue = "reports"\n'
DIGEST = """
[[schedule]]
name = "digest"
task = "app.send_digest"
every = "15m"
"""
NIGHTLY = """
[[schedule]]
name = "nightly"
task = "app.nightly"
cron = "0 9 * * *"
tz = "Europe/Paris"
"""
FILE = HEAD + DIGEST + NIGHTLY


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix."""
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str | None] | None = None, **kwargs: Any) -> Result:
        return runner.invoke(
            cli,
            ["--redis-url", redis_url, "--prefix", prefix, *args],
            env=env,
            catch_exceptions=False,
            **kwargs,
        )

    return invoke


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- list / show / next -----------------------------------------------------------------


def test_list_prints_a_table_with_cadence_next_run_in_the_schedule_zone_and_state(
    run: Run, repeat: Repeat
) -> None:
    repeat.register("reports", "digest", every="15m", template={"task": "t"})
    repeat.register(
        "reports", "nightly", cron="0 9 * * *", tz="Europe/Paris", template={"task": "t"}
    )
    repeat.pause("reports", "digest")
    result = run("list")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == [
        *("QUEUE", "NAME", "CADENCE", "NEXT", "RUN", "LAST", "RUN", "LAST", "STATUS", "STATE")
    ]
    nightly = next(r for r in rows if "nightly" in r)
    assert "cron 0 9 * * * (Europe/Paris)" in nightly
    assert " 09:00:00 CE" in nightly  # CET or CEST, the schedule's own zone
    assert "(in " in nightly
    assert "never" in nightly
    assert nightly.rstrip().endswith("active")
    assert nightly.split()[-2] == "-"  # no outcome reported yet
    digest = next(r for r in rows if "digest" in r)
    assert "every 15m" in digest
    assert digest.rstrip().endswith("paused")


def test_list_json_parses_and_carries_every_field_a_script_needs(run: Run, repeat: Repeat) -> None:
    # A slot far from now: one passing before `list` would leave the next run in the past.
    offset = quiet_offset("15m")
    repeat.register(
        "reports", "digest", every="15m", offset=offset, template={"task": "t", "args": [1]}
    )
    repeat.register("emails", "retry", cron="*/5 * * * *", template={"task": "r"})
    everything = json.loads(run("list", "--json").stdout)
    assert sorted((r["queue"], r["name"]) for r in everything) == [
        ("emails", "retry"),
        ("reports", "digest"),
    ]
    only = json.loads(run("list", "reports", "--json").stdout)
    assert len(only) == 1
    digest = only[0]
    assert digest["cadence"] == define(every="15m", offset=offset).cadence.describe()
    assert digest["cadence"].startswith("every 15m offset ")
    assert digest["every_ms"] == 900_000
    assert digest["state"] == "active"
    assert digest["template"] == {"task": "t", "args": [1]}
    assert digest["next_run_ms"] == digest["now_ms"] + digest["next_run_in_ms"]
    assert 0 < digest["next_run_in_ms"] <= 900_000
    assert digest["next_run"].endswith("+00:00")
    assert digest["last_run"] is None


def test_list_of_an_empty_registry_says_so_on_stderr_and_exits_0(run: Run) -> None:
    result = run("list")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no schedules" in result.stderr
    assert json.loads(run("list", "--json").stdout) == []


def test_show_prints_one_schedule_and_its_json(run: Run, repeat: Repeat) -> None:
    repeat.upsert("reports", "digest", every="15m", template={"task": "t"}, source="ops")
    text = run("show", "reports", "digest")
    assert text.exit_code == 0
    assert text.stdout.splitlines()[0] == "reports/digest"
    assert "every 15m" in text.stdout
    assert "source    ops" in text.stdout
    data = json.loads(run("show", "reports", "digest", "--json").stdout)
    assert (data["queue"], data["name"], data["source"]) == ("reports", "digest", "ops")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("add", "q", "x", "--task", "t", "--every", "5s", "--limit", "0"),
            "Invalid value for '--limit': 0 is not in the range 1<=x<=1000000000. "
            "(see 'emq-bridge add --help')",
        ),
        (("lsit",), "No such command 'lsit'. Did you mean 'list'? (see 'emq-bridge --help')"),
        (("add", "q"), "Missing argument 'NAME'. (see 'emq-bridge add --help')"),
        (("history", "q", "n", "-n", "0"), "(see 'emq-bridge history --help')"),
    ],
)
def test_bad_usage_is_one_line_on_stderr_and_exit_2(
    run: Run, repeat: Repeat, args: tuple[str, ...], said: str
) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: ") and line.endswith(said), line


def test_a_bad_group_option_is_one_line_too() -> None:
    result = CliRunner().invoke(cli, ["--prefix", "", "list"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "Error: Invalid value for '--prefix': prefix must not be empty (see 'emq-bridge --help')"
    ]


def test_show_of_an_unknown_schedule_exits_1_with_one_line(run: Run) -> None:
    result = run("show", "reports", "ghost")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(
        "Error: no registration 'ghost' in queue 'reports' at redis"
    )


def test_next_lists_upcoming_runs_with_utc_offsets_across_dst(run: Run, repeat: Repeat) -> None:
    repeat.register(
        "reports", "nightly", cron="30 2 * * *", tz="Europe/Paris", template={"task": "t"}
    )
    text = run("next", "reports", "nightly", "-n", "10")
    assert text.exit_code == 0
    assert len(text.stdout.splitlines()) == 10
    runs = json.loads(run("next", "reports", "nightly", "-n", "400", "--json").stdout)
    assert len(runs) == 400
    assert [r["at_ms"] for r in runs] == sorted({r["at_ms"] for r in runs})
    offsets = {r["at"][-6:] for r in runs}
    assert offsets == {"+01:00", "+02:00"}  # a year of daily runs crosses both DST changes
    assert all(r["at"][11:16] in ("02:30", "03:00") for r in runs)  # 03:00 on spring-forward day
    assert run("next", "reports", "nightly", "-n", "0").exit_code == 2


# -- add / remove / pause / resume / trigger --------------------------------------------


def test_add_registers_then_is_idempotent_and_refuses_a_different_definition_without_replace(
    run: Run, repeat: Repeat
) -> None:
    added = run(
        "add", "reports", "digest", "--task", "app.digest", "--every", "15m", "--kwargs", '{"a": 1}'
    )
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("added reports/digest")
    registration = repeat.get("reports", "digest")
    assert registration is not None
    assert registration.source is None
    assert dict(registration.definition.template) == {
        "task": "app.digest",
        "args": [],
        "kwargs": {"a": 1},
        "options": {},
    }

    again = run(
        "add", "reports", "digest", "--task", "app.digest", "--every", "15m", "--kwargs", '{"a": 1}'
    )
    assert again.exit_code == 0
    assert "identical" in again.stdout

    other = run("add", "reports", "digest", "--task", "app.digest", "--every", "5m")
    assert other.exit_code == 1
    assert "--replace" in other.stderr

    replaced = run("add", "reports", "digest", "--task", "app.digest", "--every", "5m", "--replace")
    assert replaced.exit_code == 0
    assert replaced.stdout.startswith("updated reports/digest")
    registration = repeat.get("reports", "digest")
    assert registration is not None
    assert registration.definition.cadence == Every(300_000)


def test_add_with_a_cron_and_zone(run: Run, repeat: Repeat) -> None:
    result = run(
        "add",
        "reports",
        "nightly",
        "--task",
        "n",
        "--cron",
        "0 9 * * 1-5",
        "--tz",
        "Europe/Paris",
        "--args",
        '["pdf"]',
        "--options",
        '{"priority": 3}',
        "--misfire",
        "catchup",
    )
    assert result.exit_code == 0, result.output
    registration = repeat.get("reports", "nightly")
    assert registration is not None
    assert registration.definition.cadence.describe() == "cron 0 9 * * 1-5 (Europe/Paris)"
    assert registration.definition.misfire == "catchup"
    assert registration.definition.template["options"] == {"priority": 3}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--every", "1m", "--cron", "* * * * *"], 1, "field 'cron': give only one of"),
        ([], 1, "field 'every': no cadence"),
        (["--cron", "99 * * * *"], 1, "field 'cron': invalid cron"),
        (["--cron", "0 9 * * *", "--tz", "Mars/Olympus"], 1, "field 'tz': unknown time zone"),
        (["--every", "1m", "--args", "not json"], 2, "not JSON"),
        (["--every", "1m", "--kwargs", "[1]"], 2, "must be a JSON object"),
    ],
)
def test_add_with_bad_input_exits_non_zero_with_one_line_and_writes_nothing(
    run: Run, repeat: Repeat, args: list[str], code: int, message: str
) -> None:
    result = run("add", "reports", "bad", "--task", "t", *args)
    assert result.exit_code == code
    assert message in result.stderr
    if code == 1:
        assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(repeat) == {}


def test_remove_deletes_a_schedule_and_exits_1_for_an_unknown_one(run: Run, repeat: Repeat) -> None:
    repeat.register("reports", "digest", every="15m", template={"task": "t"})
    assert run("remove", "reports", "digest").exit_code == 0
    assert repeat.get("reports", "digest") is None
    missing = run("remove", "reports", "digest")
    assert missing.exit_code == 1
    assert "no registration 'digest'" in missing.stderr


def test_pause_and_resume_change_the_state_and_report_no_ops(run: Run, repeat: Repeat) -> None:
    repeat.register("reports", "digest", every="15m", template={"task": "t"})
    assert run("pause", "reports", "digest").stdout == "paused reports/digest\n"
    assert "already paused" in run("pause", "reports", "digest").stdout
    assert json.loads(run("show", "reports", "digest", "--json").stdout)["state"] == "paused"
    assert run("resume", "reports", "digest").stdout == "resumed reports/digest\n"
    assert "was not paused" in run("resume", "reports", "digest").stdout
    assert json.loads(run("show", "reports", "digest", "--json").stdout)["state"] == "active"
    for command in ("pause", "resume", "trigger"):
        unknown = run(command, "reports", "ghost")
        assert unknown.exit_code == 1
        assert unknown.stderr.strip().startswith(
            "Error: no registration 'ghost' in queue 'reports' at redis"
        )


def test_trigger_prints_a_fresh_occurrence_id_that_a_pump_then_dispatches(
    run: Run, repeat: Repeat, prefix: str
) -> None:
    # A top of the hour before the pump would send the hour's slot too.
    repeat.register("reports", "digest", every="1h", offset=quiet_offset(), template={"task": "t"})
    triggered = run("trigger", "reports", "digest")
    assert triggered.exit_code == 0
    occurrence_id = triggered.stdout.strip()
    assert len(occurrence_id) == 36
    pumped = run("pump", "reports", "--list-key", f"{prefix}:out", "--once")
    assert pumped.exit_code == 0, pumped.output
    assert pumped.stdout.startswith("dispatched 1,")
    messages = [json.loads(m) for m in repeat.client.lrange(f"{prefix}:out", 0, -1)]
    assert [m["id"] for m in messages] == [occurrence_id]


def test_pump_once_sends_every_slot_a_misfire_all_schedule_has_due(
    run: Run, repeat: Repeat, prefix: str
) -> None:
    # Before: one slot a run (`all` sends one slot a claim), so a cron-driven `--once` never
    # caught up: `dispatched 1`, the next run still "6 s ago".
    now_ms = repeat.server_time_ms()
    start = (now_ms // 1000) * 1000 - 6000
    repeat.register(
        "reports", "backlog", every="1s", misfire="all", template={"task": "t"}, now_ms=start
    )
    pumped = run("pump", "reports", "--list-key", f"{prefix}:out", "--once")
    assert pumped.exit_code == 0, pumped.output
    dues = [json.loads(m)["due_ms"] for m in repeat.client.lrange(f"{prefix}:out", 0, -1)]
    assert len(dues) >= 6 and dues == sorted(set(dues))
    assert pumped.stdout.startswith(f"dispatched {len(dues)},")
    registration = repeat.get("reports", "backlog")
    assert registration is not None and registration.missed == 0


# -- sync ---------------------------------------------------------------------------------


def test_sync_prints_the_plan_as_a_diff_and_dry_run_writes_nothing(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    dry = run("sync", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines() == [
        "+ reports/digest  every 15m",
        "+ reports/nightly  cron 0 9 * * * (Europe/Paris)",
    ]
    assert "dry run: nothing written" in dry.stderr
    assert snapshot(repeat) == {}

    assert run("sync", str(path)).exit_code == 0
    assert sorted(repeat.names("reports")) == ["digest", "nightly"]
    repeat.register("reports", "manual", every="1m", template={"task": "m"})

    path.write_text(HEAD + DIGEST.replace('every = "15m"', 'every = "5m"'))
    changed = run("sync", str(path))
    assert changed.stdout.splitlines() == [
        "~ reports/digest  every 15m -> every 5m",
        "- reports/nightly  cron 0 9 * * * (Europe/Paris)",
    ]
    assert "reports/digest" not in changed.stderr  # each change told once, as the diff
    assert sorted(repeat.names("reports")) == ["digest", "manual"]
    same = run("sync", str(path), "--dry-run")  # reads the file and the registry
    assert same.stdout.splitlines() == ["= reports/digest  every 5m"]
    # The same bytes again, and nothing else wrote the file's schedules: only the summary.
    stamped = run("sync", str(path))
    assert stamped.exit_code == 0 and stamped.stdout == ""
    assert "0 created, 0 updated, 0 removed, 1 unchanged" in stamped.stderr
    assert "nothing read" in stamped.stderr
    repeat.cancel("reports", "digest")  # another writer: the next sync reads in full
    assert run("sync", str(path)).stdout.splitlines() == ["+ reports/digest  every 5m"]
    path.write_text(FILE)
    verbose = run("-v", "sync", str(path))  # -v: the sync's own log lines as well
    assert "WARNING emq_bridge.sync: sync ops: ~ reports/digest" in verbose.stderr


def test_sync_no_prune_keeps_dropped_schedules_and_json_parses(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    first = json.loads(run("sync", str(path), "--json").stdout)
    assert first["source"] == "ops"
    assert sorted(i["name"] for i in first["create"]) == ["digest", "nightly"]
    assert run("sync", str(path)).stdout == ""  # stamped: the summary only
    # --json reads the file and the registry even when the stamp holds: every item is listed.
    again = json.loads(run("sync", str(path), "--json").stdout)
    assert sorted(i["name"] for i in again["unchanged"]) == ["digest", "nightly"]
    path.write_text('source = "ops"\n')
    kept = json.loads(run("sync", str(path), "--no-prune", "--json").stdout)
    assert kept["remove"] == []
    assert sorted(repeat.names("reports")) == ["digest", "nightly"]
    # A file that declares nothing prunes all only when asked (session 27: an emptied file).
    assert run("sync", str(path), "--json").exit_code == 1
    pruned = json.loads(run("sync", str(path), "--json", "--allow-empty").stdout)
    assert sorted(i["name"] for i in pruned["remove"]) == ["digest", "nightly"]


BAD_FILES = [
    pytest.param("[[schedule]\n", "not valid TOML", id="malformed-toml"),
    pytest.param(
        FILE + "colour = 'red'\n",
        "schedule #2 (reports/nightly), field 'colour': unknown key",
        id="unknown-key",
    ),
    pytest.param(
        FILE + "every = '1m'\n",
        "schedule #2 (reports/nightly), field 'cron': give only one of",
        id="every-and-cron",
    ),
    pytest.param(
        FILE.replace('every = "15m"\n', ""),
        "schedule #1 (reports/digest), field 'every': no cadence",
        id="neither",
    ),
    pytest.param(
        FILE.replace("0 9 * * *", "0 25 * * *"),
        "schedule #2 (reports/nightly), field 'cron'",
        id="invalid-cron",
    ),
    pytest.param(
        FILE.replace("Europe/Paris", "Europe/Atlantis"),
        "schedule #2 (reports/nightly), field 'tz'",
        id="unknown-tz",
    ),
    pytest.param(
        FILE.replace('"nightly"', '"digest"'),
        "schedule #2 (reports/digest), field 'name': duplicate",
        id="duplicate-name",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_sync_of_a_bad_file_exits_1_with_a_line_naming_the_entry_and_leaves_the_registry_unchanged(
    run: Run, repeat: Repeat, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE.replace('every = "15m"', 'every = "1h"'))
    assert run("sync", str(path)).exit_code == 0
    repeat.register("reports", "manual", every="1m", template={"task": "m"})
    before = snapshot(repeat)
    path.write_text(text)
    result = run("sync", str(path))
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"Error: {path}: ")
    assert message in lines[0]
    assert snapshot(repeat) == before


# -- pump ---------------------------------------------------------------------------------


def test_pump_once_syncs_a_file_and_pushes_due_occurrences_onto_a_list(
    run: Run, repeat: Repeat, tmp_path: Path, prefix: str
) -> None:
    path = tmp_path / "schedules.toml"
    # digest's slot far from now: one passing between the sync and the pump would be sent.
    quiet = f'every = "15m"\noffset = "{quiet_offset("15m")}"\n'
    path.write_text(FILE.replace('every = "15m"\n', quiet))
    repeat.register(
        "reports", "due", every="1h", template={"task": "d"}, now_ms=0
    )  # due since 1970
    result = run("pump", "--file", str(path), "--list-key", f"{prefix}:out", "--once")
    assert result.exit_code == 0, result.output
    assert "synced ops: 2 created" in result.stderr
    assert sorted(repeat.names("reports")) == ["digest", "due", "nightly"]
    messages = [json.loads(m) for m in repeat.client.lrange(f"{prefix}:out", 0, -1)]
    assert [(m["queue"], m["name"], m["template"]) for m in messages] == [
        ("reports", "due", {"task": "d"})
    ]
    # Restarted on the same file: its sync's stamp holds, so no record is read.
    again = run("pump", "--file", str(path), "--list-key", f"{prefix}:out", "--once")
    assert "synced ops: 0 created, 0 updated, 0 removed, 2 unchanged (its stamp holds" in (
        again.stderr
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reports"], "give exactly one target"),
        (["reports", "--list-key", "k", "--celery", "x"], "got --celery and --list-key"),
        (["--list-key", "k"], "no queues to pump"),
        (["reports", "--list-key", "k", "--pipelined"], "--pipelined applies to"),
    ],
)
def test_pump_with_bad_usage_exits_2(run: Run, args: list[str], message: str) -> None:
    result = run("pump", *args, "--once")
    assert result.exit_code == 2
    assert message in result.stderr


def test_pump_with_an_adapter_that_cannot_load_exits_1_with_one_line(run: Run) -> None:
    result = run("pump", "--dramatiq", "no_such_module_anywhere_xyz", "--once")
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1


# -- demo, help, errors, logging -----------------------------------------------------------


def test_demo_runs_on_the_redis_url_given_and_on_an_embedded_server_without_one(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    import emq_bridge.demo

    calls: list[str | None] = []
    monkeypatch.setattr(emq_bridge.demo, "main", lambda url=None: calls.append(url))
    monkeypatch.delenv("REDIS_URL", raising=False)
    given = CliRunner().invoke(cli, ["--redis-url", redis_url, "demo"], catch_exceptions=False)
    embedded = CliRunner().invoke(cli, ["demo"], catch_exceptions=False)
    assert given.exit_code == 0 and embedded.exit_code == 0
    assert calls == [redis_url, None]


def test_demo_on_an_unreachable_redis_url_exits_3_in_one_line() -> None:
    result = CliRunner().invoke(cli, ["--redis-url", "redis://127.0.0.1:1/0", "demo"])
    assert result.exit_code == 3
    assert len(result.output.strip().splitlines()) == 1


COMMANDS = [
    "list",
    "show",
    "next",
    "add",
    "remove",
    "pause",
    "resume",
    "trigger",
    "sync",
    "pump",
    "demo",
]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_works_everywhere_and_shows_examples(command: str | None) -> None:
    args = [command, "--help"] if command else ["--help"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0
    assert "Example" in result.stdout


def test_an_unreachable_server_exits_3_with_one_line_that_never_shows_the_password(
    tmp_path: Path,
) -> None:
    port = unused_port()
    url = f"redis://admin:s3cr3t-pw@127.0.0.1:{port}/0"
    runner = CliRunner()
    for args in (
        ["list"],
        ["show", "q", "n"],
        ["pause", "q", "n"],
        ["pump", "q", "--list-key", "k"],
        ["sync", str(tmp_path / "none.toml")],
    ):
        result = runner.invoke(cli, ["--redis-url", url, *args])
        if args[0] == "sync":  # the file is checked before the server is
            assert result.exit_code == 1
            continue
        assert result.exit_code == 3, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1
        assert "cannot reach Redis at redis://admin:***@127.0.0.1" in lines[0]
        assert "s3cr3t-pw" not in result.output
    from_env = runner.invoke(
        cli, ["list"], env={"REDIS_URL": f"redis://:hunter22@127.0.0.1:{port}/0"}
    )
    assert from_env.exit_code == 3
    assert "hunter22" not in from_env.output


def test_a_malformed_redis_url_or_prefix_is_a_usage_error() -> None:
    runner = CliRunner()
    bad_url = runner.invoke(cli, ["--redis-url", "http://user:pw-secret@host/", "list"])
    assert bad_url.exit_code == 2
    assert "pw-secret" not in bad_url.output
    bad_prefix = runner.invoke(cli, ["--prefix", "a b", "list"])
    assert bad_prefix.exit_code == 2
    assert "--prefix" in bad_prefix.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host", "redis://:***@host"),
        ("redis://tokenonly@host", "redis://***@host"),
        (
            "rediss://host:6380/1?password=pw&ssl_cert_reqs=none",
            "rediss://host:6380/1?password=***&ssl_cert_reqs=none",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis.sock?db=2", "unix:///run/redis.sock?db=2"),
        ("unix:///run/redis.sock?password=pw", "unix:///run/redis.sock?password=***"),
    ],
)
def test_urls_are_redacted_before_they_are_printed(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_cli_installs_its_log_handler_only_for_the_command_and_removes_it(
    run: Run, repeat: Repeat
) -> None:
    logger = logging.getLogger("emq_bridge")
    before = list(logger.handlers)
    assert run("-v", "list").exit_code == 0
    assert logger.handlers == before


def test_pump_once_with_a_dramatiq_app_enqueues_a_real_message_with_the_occurrence_id(
    run: Run, repeat: Repeat, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"cliapp_{prefix}"
    queue = f"{prefix}-work"
    (tmp_path / f"{module}.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "broker = StubBroker()\n"
        f"@dramatiq.actor(broker=broker, queue_name={queue!r})\n"
        "def work(n): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    repeat.register(  # `earliest`: the missed slot that fires is the first, 01:00 UTC 1970
        queue,
        "job",
        every="1h",
        misfire="earliest",
        template={"task": "work", "args": [7]},
        now_ms=0,
    )
    result = run("pump", "--dramatiq", f"{module}:broker", "--once")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dispatched 1,")
    broker = sys.modules[module].broker
    message = broker.queues[queue].get(timeout=1)
    decoded = json.loads(message)
    assert decoded["actor_name"] == "work"
    assert decoded["args"] == [7]
    assert decoded["message_id"] == occurrence_id(prefix, queue, "job", 3_600_000)


def test_pump_once_pipelined_with_a_celery_app_pushes_real_task_messages_in_one_batch(
    run: Run, repeat: Repeat, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"cliceleryapp_{prefix}"
    queue = f"{prefix}-work"
    url = repeat.client.connection_pool.connection_kwargs
    broker = f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}"
    (tmp_path / f"{module}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('cliapp', broker={broker!r})\n"
        f"app.conf.emq_bridge_prefix = {prefix!r}  # the app's registry is the one pumped\n"
        "@app.task(name='work')\n"
        "def work(n): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for i in range(3):
        repeat.register(
            queue,
            f"job-{i}",
            every="1h",
            misfire="earliest",  # the missed slot that fires is the first, 01:00 UTC 1970
            template={"task": "work", "args": [i]},
            now_ms=0,
        )
    result = run("pump", queue, "--celery", f"{module}:app", "--pipelined", "--once")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dispatched 3,")
    messages = [json.loads(m) for m in repeat.client.lrange(queue, 0, -1)]
    assert sorted(m["headers"]["id"] for m in messages) == sorted(
        occurrence_id(prefix, queue, f"job-{i}", 3_600_000) for i in range(3)
    )
    assert {m["headers"]["task"] for m in messages} == {"work"}


def test_pump_pipelined_with_a_broker_that_is_not_redis_exits_1_with_a_clear_error(
    run: Run, repeat: Repeat, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"clistubapp_{prefix}"
    (tmp_path / f"{module}.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "broker = StubBroker()\n"
        f"@dramatiq.actor(broker=broker, queue_name={prefix + '-work'!r})\n"
        "def work(n): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("pump", "--dramatiq", f"{module}:broker", "--pipelined", "--once")
    assert result.exit_code == 1, result.output
    assert "needs a RedisBroker" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_list_show_and_next_of_a_paused_schedule_say_paused_not_a_next_run(
    run: Run, repeat: Repeat
) -> None:
    repeat.register("q", "held", every="1m", template={"task": "t"})
    repeat.pause("q", "held")
    [row] = run("list", "q").stdout.splitlines()[1:]
    assert "- (paused)" in row and "paused" in row.split()[-1] and " in " not in row
    shown = run("show", "q", "held").stdout
    assert "- (paused)" in shown
    upcoming = run("next", "q", "held", "-n", "2")
    assert "is paused: nothing fires until `emq-bridge resume q held`" in upcoming.stderr


def test_list_and_show_json_of_a_schedule_no_worker_reported_carry_the_lifecycle_fields(
    run: Run, repeat: Repeat
) -> None:
    repeat.register("q", "fresh", every="1m", template={"task": "t"})
    (listed,) = json.loads(run("list", "q", "--json").stdout)
    shown = json.loads(run("show", "q", "fresh", "--json").stdout)
    lifecycle = {
        "overlap": "allow",
        "pause_after_failures": None,
        "last_status": None,
        "last_error": None,
        "last_started_ms": None,
        "last_finished_ms": None,
        "last_duration_ms": None,
        "last_success_ms": None,
        "failures": 0,
        "skipped": 0,
        "lost": 0,
        "inflight": None,
        "buffered_due_ms": None,
    }
    for data in (listed, shown):
        assert {key: data[key] for key in lifecycle} == lifecycle
