"""The occurrence lifecycle where users see it: the schedule file, add, show, list, history.

The CLI runs in-process with click's CliRunner (and once as the console script) against a real
server. The outcomes it shows are written by the real Lua: occurrences fired by a `Pump` into a
`RecordingDispatcher`, then reported with `Repeat.report`, `started` and `finished`. The pump's
clock is the server's plus offsets given to `run_once`: smaller than the deadlines report.lua
writes from the server clock where an occurrence must stay in flight, an hour where it must be
lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from quiet import quiet_offset
from registry_state import snapshot

from emq_bridge import Occurrence, Pump, Repeat, define
from emq_bridge.cli import cli
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher

Run = Callable[..., Result]

TEMPLATE = {"task": "app.sync"}
HISTORY_HEADER = ["NOMINAL", "TIME", "STATUS", "ATTEMPT", "STARTED", "DURATION", "FLAGS", "ERROR"]


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix."""
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(
            cli, ["--redis-url", redis_url, "--prefix", prefix, *args], catch_exceptions=False
        )

    return invoke


def utc(ms: int) -> str:
    """The UTC ISO form `history` prints."""
    stamp = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{ms % 1000:03d}Z"


def start_ms(repeat: Repeat) -> int:
    """A registration time on a whole second of the server clock, a little in the past."""
    return (repeat.server_time_ms() // 1000) * 1000 - 10_000


def fire(pump: Pump, dispatcher: RecordingDispatcher, now_ms: int | None = None) -> Occurrence:
    pump.run_once(now_ms=now_ms)
    (occurrence,) = dispatcher.clear()
    return occurrence


# -- the schedule file ------------------------------------------------------------------------

FILE = """
source = "ops"
queue = "reports"

[[schedule]]
name = "sync"
task = "app.sync"
every = "5m"
overlap = "skip"
pause_after_failures = 3

[[schedule]]
name = "plain"
task = "app.plain"
every = "1h"
"""


def test_a_file_with_overlap_and_pause_after_failures_syncs_them_and_show_prints_them(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    synced = run("sync", str(path))
    assert synced.exit_code == 0, synced.output
    registration = repeat.get("reports", "sync")
    assert registration is not None
    assert registration.definition.overlap == "skip"
    assert registration.definition.pause_after_failures == 3
    plain = repeat.get("reports", "plain")
    assert plain is not None
    assert (plain.definition.overlap, plain.definition.pause_after_failures) == ("allow", None)

    shown = run("show", "reports", "sync").stdout.splitlines()
    assert "  overlap   skip" in shown
    assert "  pause     after 3 consecutive failures" in shown
    assert not any(line.startswith("  failures") for line in shown)  # nothing reported yet
    assert "  status    none reported yet (workers report each occurrence's outcome)" in shown
    plain_shown = run("show", "reports", "plain").stdout
    assert "overlap" not in plain_shown and "pause " not in plain_shown  # defaults are not shown
    data = json.loads(run("show", "reports", "sync", "--json").stdout)
    assert (data["overlap"], data["pause_after_failures"]) == ("skip", 3)

    path.write_text(
        FILE.replace('overlap = "skip"', 'overlap = "buffer_one"').replace(" = 3", " = 5")
    )
    changed = run("sync", str(path))
    assert changed.exit_code == 0, changed.output
    assert changed.stdout.splitlines() == [
        "~ reports/sync  every 5m, overlap skip -> buffer_one, pause after failures 3 -> 5",
        "= reports/plain  every 1h",
    ]
    again = repeat.get("reports", "sync")
    assert again is not None
    assert (again.definition.overlap, again.definition.pause_after_failures) == ("buffer_one", 5)


ONE_OF = "field 'overlap': must be one of allow, skip, buffer_one, replace, got"
WHOLE = "field 'pause_after_failures': must be a whole number of failures from 1 to 1000000, got"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('overlap = "sometimes"', f"{ONE_OF} 'sometimes'"),
        ("overlap = 1", f"{ONE_OF} an integer"),
        ("overlap = true", f"{ONE_OF} a boolean"),
        ('overlap = ["skip"]', f"{ONE_OF} an array"),
        ('pause_after_failures = "3"', f"{WHOLE} a string"),
        ("pause_after_failures = true", f"{WHOLE} a boolean"),
        ("pause_after_failures = 2.5", f"{WHOLE} a number"),
        ("pause_after_failures = 0", f"{WHOLE} 0; leave it out to never pause"),
        ("pause_after_failures = -2", f"{WHOLE} -2; leave it out to never pause"),
        ("pause_after_failures = 1000001", f"{WHOLE} 1000001"),
        ("pause_after_failures = 9223372036854775807", f"{WHOLE} 9223372036854775807"),
    ],
)
def test_a_file_with_a_bad_overlap_or_pause_is_refused_in_one_line_and_nothing_is_written(
    run: Run, repeat: Repeat, tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    assert run("sync", str(path)).exit_code == 0
    before = snapshot(repeat)
    # The bad line goes into the second entry, whose other fields change: none of it is written.
    path.write_text(FILE.replace('every = "5m"', 'every = "1m"') + line + "\n")
    result = run("sync", str(path))
    assert result.exit_code == 1
    assert result.stdout == ""
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith(f"Error: {path}: schedule #2 (reports/plain), ")
    assert message in error
    assert snapshot(repeat) == before


# -- add ---------------------------------------------------------------------------------------


def test_add_with_overlap_and_pause_after_failures_stores_them_and_refuses_a_change_without_replace(
    run: Run, repeat: Repeat
) -> None:
    args = ["add", "reports", "sync", "--task", "app.sync", "--every", "5m"]
    added = run(*args, "--overlap", "skip", "--pause-after-failures", "3")
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("added reports/sync")
    registration = repeat.get("reports", "sync")
    assert registration is not None
    assert registration.definition.overlap == "skip"
    assert registration.definition.pause_after_failures == 3
    record = repeat.client.hgetall(repeat.keys("reports").record("sync"))
    assert (record[b"overlap"], record[b"pause_after_failures"]) == (b"skip", b"3")

    same = run(*args, "--overlap", "skip", "--pause-after-failures", "3")
    assert same.exit_code == 0 and "identical" in same.stdout
    other = run(*args, "--overlap", "replace", "--pause-after-failures", "3")
    assert other.exit_code == 1
    assert "already exists with a different definition" in other.stderr
    assert "--replace" in other.stderr
    defaults = run(*args, "--replace")  # back to the defaults: the policies' fields go
    assert defaults.exit_code == 0, defaults.output
    record = repeat.client.hgetall(repeat.keys("reports").record("sync"))
    assert b"overlap" not in record and b"pause_after_failures" not in record


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--overlap", "sometimes"], "Invalid value for '--overlap'"),
        (["--overlap", "SKIP"], "Invalid value for '--overlap'"),
        (["--pause-after-failures", "0"], "Invalid value for '--pause-after-failures'"),
        (["--pause-after-failures", "-1"], "Invalid value for '--pause-after-failures'"),
        (["--pause-after-failures", "1000001"], "Invalid value for '--pause-after-failures'"),
        (["--pause-after-failures", "3.5"], "Invalid value for '--pause-after-failures'"),
        (["--pause-after-failures", "many"], "Invalid value for '--pause-after-failures'"),
    ],
)
def test_add_with_a_bad_overlap_or_pause_is_a_usage_error_and_writes_nothing(
    run: Run, repeat: Repeat, args: list[str], message: str
) -> None:
    result = run("add", "reports", "bad", "--task", "t", "--every", "1m", *args)
    assert result.exit_code == 2  # as --misfire and --every-ms: a value click refuses
    assert message in result.stderr
    assert snapshot(repeat) == {}


# -- show / list / history of reported outcomes -------------------------------------------------


def test_show_list_and_history_print_what_workers_reported_of_occurrences_a_pump_fired(
    run: Run, repeat: Repeat, prefix: str
) -> None:
    t0 = start_ms(repeat)
    repeat.register(
        "reports", "sync", every="1s", template=TEMPLATE, overlap="skip",
        pause_after_failures=3, now_ms=t0,
    )  # fmt: skip
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], dispatcher)
    first = fire(pump, dispatcher, t0 + 1000)
    assert first.due_ms == t0 + 1000
    # The worker's own clock: started 100 ms after the slot, failed 1.5 s later.
    assert repeat.report([report_of("started", first, at_ms=t0 + 1100)]) == 1
    running = run("show", "reports", "sync").stdout.splitlines()
    assert any(line.startswith("  status    running since ") for line in running)
    assert any(line.startswith("  in flight slot ") for line in running)
    assert run("list", "reports").stdout.splitlines()[1].split()[-2] == "running"

    pump.run_once(now_ms=t0 + 2000)  # the next slot, while the first runs: skipped
    assert dispatcher.clear() == []
    assert repeat.report([report_of("failed", first, at_ms=t0 + 2600, error=ValueError("boom"))])
    repeat.trigger("reports", "sync", now_ms=t0 + 2500)
    second = fire(pump, dispatcher, t0 + 2500)  # before the next slot, at t0 + 3000
    assert second.triggered
    assert repeat.started(second)
    assert repeat.finished(second, ok=False, error=RuntimeError("disk full"))

    shown = run("show", "reports", "sync")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    status = next(line for line in lines if line.startswith("  status "))
    assert status.startswith("  status    failed, finished ")
    assert ", took " in status
    assert "  error     RuntimeError: disk full" in lines
    assert "  failures  2 in a row (pauses at 3)" in lines
    assert "  skipped   1" in lines
    assert "  lost      0" in lines
    assert "  overlap   skip" in lines
    assert "  pause     after 3 consecutive failures" in lines
    assert not any(line.startswith(("  in flight", "  buffered")) for line in lines)

    data = json.loads(run("show", "reports", "sync", "--json").stdout)
    assert data["last_status"] == "failed"
    assert data["last_error"] == "RuntimeError: disk full"
    assert (data["failures"], data["skipped"], data["lost"]) == (2, 1, 0)
    assert data["last_started_ms"] is not None and data["last_finished_ms"] is not None
    assert data["last_duration_ms"] == data["last_finished_ms"] - data["last_started_ms"]
    assert data["last_success_ms"] is None
    assert (data["inflight"], data["buffered_due_ms"]) == (None, None)

    listed = run("list", "reports")
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        "QUEUE", "NAME", "CADENCE", "NEXT", "RUN", "LAST", "RUN", "LAST", "STATUS", "STATE",
    ]  # fmt: skip
    assert "  failed (2 in a row)  " in row
    assert row.rstrip().endswith("active")
    (item,) = json.loads(run("list", "reports", "--json").stdout)
    assert item == {**data, "now_ms": item["now_ms"], "next_run_in_ms": item["next_run_in_ms"]}
    paged = json.loads(run("list", "reports", "--json", "--limit", "1").stdout)
    assert [(i["name"], i["last_status"], i["failures"]) for i in paged] == [("sync", "failed", 2)]

    table = run("history", "reports", "sync")
    assert table.exit_code == 0, table.output
    head, *rows = table.stdout.splitlines()
    assert head.split() == HISTORY_HEADER
    assert len(rows) == 3  # newest first: the trigger, the skipped slot, the first one
    assert rows[0].split()[1:3] == ["failed", "1"]
    assert " triggered " in rows[0] and rows[0].endswith("RuntimeError: disk full")
    assert rows[1].split() == [utc(t0 + 2000), "skipped", "1", "-", "-", "-"]
    assert rows[2].split() == [
        *(utc(t0 + 1000), "failed", "1", utc(t0 + 1100), "1.5", "s", "-", "ValueError:", "boom")
    ]

    entries = json.loads(run("history", "reports", "sync", "--json").stdout)
    assert entries == [entry.to_dict() for entry in repeat.history("reports", "sync")]
    assert [(e["id"], e["status"], e["triggered"]) for e in entries] == [
        (second.id, "failed", True),
        (entries[1]["id"], "skipped", False),
        (first.id, "failed", False),
    ]
    assert entries[2]["duration_ms"] == 1500 and entries[2]["error"] == "ValueError: boom"
    newest = json.loads(run("history", "reports", "sync", "-n", "1", "--json").stdout)
    assert [e["id"] for e in newest] == [second.id]
    assert len(run("history", "reports", "sync", "-n", "2").stdout.splitlines()) == 3
    # --status filters everything kept, then takes -n of it.
    failed = json.loads(run("history", "reports", "sync", "--status", "failed", "--json").stdout)
    assert [e["id"] for e in failed] == [second.id, first.id]
    both = run("history", "reports", "sync", "--status", "skipped", "--status", "failed", "-n", "2")
    assert [row.split()[1] for row in both.stdout.splitlines()[1:]] == ["failed", "skipped"]
    none = run("history", "reports", "sync", "--status", "lost")
    assert none.exit_code == 0 and none.stdout == ""
    assert "with status lost" in none.stderr
    assert run("history", "reports", "sync", "--status", "done").exit_code == 2


def test_the_third_failure_in_a_row_parks_the_schedule_and_list_and_show_say_why(
    run: Run, repeat: Repeat
) -> None:
    # A top of the hour mid-test would fire the hour's slot next to a trigger.
    repeat.register(
        "reports",
        "sync",
        every="1h",
        offset=quiet_offset(),
        template=TEMPLATE,
        pause_after_failures=3,
    )
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], dispatcher)
    base = repeat.server_time_ms()
    for n in range(3):
        # Each at its own millisecond: two triggers in one are one occurrence (one id).
        repeat.trigger("reports", "sync", now_ms=base + n)
        occurrence = fire(pump, dispatcher, now_ms=base + n)
        assert repeat.started(occurrence)
        assert repeat.finished(occurrence, ok=False, error=TimeoutError(f"try {n}"))
    (row,) = run("list", "reports").stdout.splitlines()[1:]
    assert "failed (3 in a row)" in row
    assert "parked: paused after 3 consecutive failures; last: TimeoutError: try 2" in row
    lines = run("show", "reports", "sync").stdout.splitlines()
    assert any(line.startswith("  state     parked since ") for line in lines)
    assert "  reason    paused after 3 consecutive failures; last: TimeoutError: try 2" in lines
    assert "  failures  3 in a row (pauses at 3)" in lines
    assert run("resume", "reports", "sync").exit_code == 0
    lines = run("show", "reports", "sync").stdout.splitlines()
    assert "  state     active" in lines
    assert "  failures  0 (pauses at 3)" in lines


def test_show_prints_the_occurrence_in_flight_and_the_slot_buffer_one_keeps(
    run: Run, repeat: Repeat
) -> None:
    t0 = start_ms(repeat)
    repeat.register(
        "reports", "sync", every="1s", template=TEMPLATE, overlap="buffer_one", now_ms=t0
    )
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], dispatcher)
    first = fire(pump, dispatcher, t0 + 1000)
    assert repeat.started(first)
    pump.run_once(now_ms=t0 + 2000)  # kept for when the first ends
    assert dispatcher.clear() == []
    lines = run("show", "reports", "sync").stdout.splitlines()
    assert "  overlap   buffer_one" in lines
    in_flight = next(line for line in lines if line.startswith("  in flight "))
    buffered = next(line for line in lines if line.startswith("  buffered "))
    assert in_flight.startswith("  in flight slot ") and "(triggered)" not in in_flight
    assert buffered.startswith("  buffered  slot ")
    data = json.loads(run("show", "reports", "sync", "--json").stdout)
    assert data["inflight"] == {
        "member": first.lease_member,
        "due_ms": t0 + 1000,
        "triggered": False,
    }
    assert data["buffered_due_ms"] == t0 + 2000
    assert data["last_status"] == "running"

    assert repeat.finished(first, ok=True)  # releases the buffered slot: sent next
    released = fire(pump, dispatcher, t0 + 2100)
    assert released.due_ms == t0 + 2000
    lines = run("show", "reports", "sync").stdout.splitlines()
    assert not any(line.startswith("  buffered ") for line in lines)
    assert any(line.startswith("  last ok   ") for line in lines)
    assert any(line.startswith("  status    succeeded, finished ") for line in lines)


def test_show_and_history_of_an_occurrence_lost_then_of_a_failure_reported_without_a_start(
    run: Run, repeat: Repeat
) -> None:
    t0 = start_ms(repeat)
    hour = 3_600_000
    # The first slot half an hour after t0: a top of the hour just after t0 would fire it
    # next to the first trigger.
    offset = quiet_offset(now_ms=t0)
    repeat.register("reports", "sync", every="1h", offset=offset, template=TEMPLATE, now_ms=t0)
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], dispatcher)
    repeat.trigger("reports", "sync", now_ms=t0 + 1000)  # one that ran 250 ms, first
    ran = fire(pump, dispatcher, t0 + 1000)
    repeat.report([report_of("started", ran, at_ms=t0 + 1000)])
    repeat.report([report_of("succeeded", ran, at_ms=t0 + 1250)])
    assert "took 250 ms" in run("show", "reports", "sync").stdout

    # The pump's clock an hour on: the slot fires, its worker starts it and goes silent.
    silent = fire(pump, dispatcher, t0 + hour)
    repeat.report([report_of("started", silent, at_ms=t0 + hour + 50)], heartbeat_ttl_ms=200)
    time.sleep(0.3)  # no heartbeat for longer than its TTL, on the server's clock
    pump.run_once(now_ms=t0 + hour + 600)  # lost
    lines = run("show", "reports", "sync").stdout.splitlines()
    assert "  status    lost (not started in time, or no word from its worker in time)" in lines
    assert "  lost      1" in lines
    row = run("history", "reports", "sync").stdout.splitlines()[1]
    slot = define(every="1h", offset=offset).cadence.next_after(t0)  # the first slot after t0
    assert row.split() == [utc(slot), "lost", "1", utc(t0 + hour + 50), "-", "-"]

    # A worker that reports only the end: no duration (not the one of an occurrence before).
    repeat.trigger("reports", "sync", now_ms=t0 + hour + 700)
    unstarted = fire(pump, dispatcher, t0 + hour + 700)
    assert repeat.finished(unstarted, ok=False, error="KeyError: 'x'")
    lines = run("show", "reports", "sync").stdout.splitlines()
    status = next(line for line in lines if line.startswith("  status "))
    assert status.startswith("  status    failed, finished ") and "took" not in status
    assert "  error     KeyError: 'x'" in lines
    assert any(line.startswith("  last ok   ") for line in lines)
    assert json.loads(run("show", "reports", "sync", "--json").stdout)["last_duration_ms"] is None
    entries = json.loads(run("history", "reports", "sync", "--json").stdout)
    assert [(e["status"], e["started_ms"], e["duration_ms"]) for e in entries] == [
        ("failed", None, None),
        ("lost", t0 + hour + 50, None),
        ("succeeded", t0 + 1000, 250),
    ]


def test_history_of_an_unknown_schedule_exits_1_and_of_a_quiet_one_prints_nothing(
    run: Run, repeat: Repeat
) -> None:
    unknown = run("history", "reports", "ghost")
    assert unknown.exit_code == 1
    assert unknown.stderr.strip().startswith(
        "Error: no registration 'ghost' in queue 'reports' at redis"
    )
    assert run("history", "reports", "ghost", "--json").exit_code == 1
    repeat.register("reports", "quiet", every="1h", template=TEMPLATE)
    quiet = run("history", "reports", "quiet")
    assert quiet.exit_code == 0
    assert quiet.stdout == ""
    assert "no occurrences recorded for reports/quiet" in quiet.stderr
    assert json.loads(run("history", "reports", "quiet", "--json").stdout) == []
    assert run("list", "reports").stdout.splitlines()[1].split()[-2:] == ["-", "active"]
    for bad in ("0", "10001", "x"):
        assert run("history", "reports", "quiet", "-n", bad).exit_code == 2


def test_history_help_shows_examples() -> None:
    result = CliRunner().invoke(cli, ["history", "--help"])
    assert result.exit_code == 0
    assert "Example" in result.stdout and "emq-bridge history reports digest" in result.stdout


def test_the_console_script_prints_history_as_json(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    # A top of the hour before the pump would fire the hour's slot next to the trigger.
    repeat.register("reports", "sync", every="1h", offset=quiet_offset(), template=TEMPLATE)
    repeat.trigger("reports", "sync")
    dispatcher = RecordingDispatcher()
    occurrence = fire(Pump(repeat, ["reports"], dispatcher), dispatcher)
    assert repeat.started(occurrence) and repeat.finished(occurrence, ok=True)
    script = Path(sys.executable).parent / "emq-bridge"
    where = ["--redis-url", redis_url, "--prefix", prefix]
    done = subprocess.run(
        [str(script), *where, "history", "reports", "sync", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)
    assert (entry["id"], entry["status"], entry["triggered"]) == (occurrence.id, "succeeded", True)


def test_show_says_a_succeeded_runs_error_is_from_an_earlier_run(run: Run, repeat: Repeat) -> None:
    # Before: "(an earlier occurrence's)", when the error was this occurrence's first attempt;
    # then "(from an earlier attempt)", when it was an earlier occurrence's. A run is either.
    repeat.register("reports", "sync", every="1h", offset=quiet_offset(), template=TEMPLATE)
    dispatcher = RecordingDispatcher()
    base = repeat.server_time_ms()
    repeat.trigger("reports", "sync", now_ms=base)
    occurrence = fire(Pump(repeat, ["reports"], dispatcher), dispatcher, now_ms=base)
    failed = report_of("retrying", occurrence, attempt=1, error=ValueError("flaky"))
    assert repeat.report([failed, report_of("succeeded", occurrence, attempt=2)]) == 2
    shown = run("show", "reports", "sync").stdout
    assert "ValueError: flaky (from an earlier run)" in shown
