"""Two CLI probes (session 30): the state of a schedule `pause_after_failures` stopped, and
`add --replace` over a schedule a source owns.

A failure streak parks the schedule (docs/schedules-and-cli.md: `list` shows `parked: paused
after 3 consecutive failures; last: ...` until `resume`; `resume --all` leaves it parked), so
`list`, `show`, `show --json` and the web view all call it parked: pinned here, unchanged.

`add --replace` writes with no source, so over a schedule a file, an app or an import owns
it silently made it a runtime one: the owner's next sync put its own definition back (undoing
the edit) while it declared the name, and never removed it once it did not. It now warns in
one line on stderr, naming the source and what its next sync does, and still exits 0.

The CLI runs in-process with click's CliRunner against the real server of the fixtures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runs import Run, cli_runner
from click.testing import Result
from quiet import quiet_offset

from emq_bridge import Pump, Repeat, define
from emq_bridge.testing import RecordingDispatcher
from emq_bridge.web.pages import state_of_fields

FILE = """
source = "ops"
queue = "reports"

[[schedule]]
name = "digest"
task = "app.digest"
every = "15m"
"""

# What `add --replace` writes over the file's `every = "15m"`.
REPLACE = ("add", "reports", "digest", "--task", "app.digest", "--every", "5m", "--replace")


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix."""
    return cli_runner(redis_url, prefix)


def warnings_of(result: Result) -> list[str]:
    """The `warning:` lines a command printed on stderr."""
    return [line for line in result.stderr.splitlines() if line.startswith("warning:")]


# -- 1. a failure streak parks: every view says so ----------------------------------------


def test_a_schedule_paused_by_its_failure_streak_is_parked_in_list_show_json_and_web(
    run: Run, repeat: Repeat
) -> None:
    repeat.register(
        "reports",
        "sync",
        every="1h",
        offset=quiet_offset(),  # no slot of its own falls due mid-test
        template={"task": "app.sync"},
        pause_after_failures=2,
    )
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], dispatcher)
    base = repeat.server_time_ms()
    for n in range(2):
        repeat.trigger("reports", "sync", now_ms=base + n)  # each its own occurrence
        pump.run_once(now_ms=base + n)
        (occurrence,) = dispatcher.clear()
        assert repeat.started(occurrence)
        assert repeat.finished(occurrence, ok=False, error=ValueError(f"bad {n}"))
    reason = "paused after 2 consecutive failures; last: ValueError: bad 1"

    (row,) = run("list", "reports").stdout.splitlines()[1:]
    assert f"parked: {reason}" in row
    lines = run("show", "reports", "sync").stdout.splitlines()
    assert any(line.startswith("  state     parked since ") for line in lines)
    assert f"  reason    {reason}" in lines
    shown = json.loads(run("show", "reports", "sync", "--json").stdout)
    assert (shown["state"], shown["parked_reason"]) == ("parked", reason)
    record = repeat.load_records("reports", ["sync"], ("paused", "parked_reason", "completed"))
    assert state_of_fields(record["sync"]) == "parked"  # the web view's own reading
    # Parked, not paused: a bulk resume leaves it; a resume by name starts it again.
    assert run("resume", "reports", "--all").exit_code == 0
    assert json.loads(run("show", "reports", "sync", "--json").stdout)["state"] == "parked"
    assert run("resume", "reports", "sync").exit_code == 0
    assert json.loads(run("show", "reports", "sync", "--json").stdout)["state"] == "active"


# -- 2. add --replace of an owned schedule says whose it was ---------------------------------


def test_add_replace_of_a_synced_schedule_warns_that_the_file_takes_it_back(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    assert run("sync", str(path)).exit_code == 0
    assert repeat.read("reports", "digest").source == "ops"

    replaced = run(*REPLACE)
    assert replaced.exit_code == 0
    assert replaced.stdout.startswith("updated reports/digest")
    assert warnings_of(replaced) == [
        "warning: --replace took reports/digest from source ops (a runtime schedule now): the "
        "next sync of ops puts its own definition back if it still declares digest; if not, "
        "no sync removes it"
    ]
    assert repeat.read("reports", "digest").source is None

    # What the warning says: the file's next sync takes it back, with the file's cadence...
    synced = run("sync", str(path))
    assert "~ reports/digest  every 5m -> every 15m, owner runtime -> ops" in synced.stdout
    taken_back = repeat.read("reports", "digest")
    assert (taken_back.source, taken_back.definition.cadence.describe()) == ("ops", "every 15m")
    # ... and once the file no longer declares it, a sync leaves the runtime one alone.
    assert warnings_of(run(*REPLACE))
    path.write_text(FILE.replace('name = "digest"', 'name = "other"'))
    assert "reports/digest" not in run("sync", str(path)).stdout
    assert repeat.read("reports", "digest").source is None


def test_add_replace_of_an_imported_schedule_warns_that_an_import_leaves_it_alone(
    run: Run, repeat: Repeat
) -> None:
    definition = define(every="15m", template={"task": "app.digest"})
    repeat.upsert("reports", "digest", definition=definition, source="import:redbeat")

    replaced = run(*REPLACE)
    assert replaced.exit_code == 0
    assert warnings_of(replaced) == [
        "warning: --replace took reports/digest from source import:redbeat (a runtime "
        "schedule now): an import run again leaves it alone"
    ]
    # An import writes with keep_owners: the runtime schedule is not its to rewrite.
    again = repeat.upsert_many(
        [("reports", "digest", definition)], source="import:redbeat", keep_owners=True
    )
    assert again == ["owned"]
    assert repeat.read("reports", "digest").definition.cadence.describe() == "every 5m"


def test_add_replace_of_a_runtime_or_new_schedule_warns_of_nothing(run: Run) -> None:
    created = run(*REPLACE)
    assert created.exit_code == 0 and created.stdout.startswith("created reports/digest")
    assert warnings_of(created) == []
    updated = run(*REPLACE[:-2], "1h", "--replace")
    assert updated.exit_code == 0 and updated.stdout.startswith("updated reports/digest")
    assert warnings_of(updated) == []
    unchanged = run(*REPLACE[:-2], "1h", "--replace")
    assert unchanged.stdout.startswith("unchanged reports/digest")
    assert warnings_of(unchanged) == []
