"""`export` of a registry of several owners, without `--source`, says what its sync does.

Such a file declares no source, so `emq-bridge sync FILE` takes every schedule over to the
file's own (`file:<its name>`). The export used to write it without a word; now a `note:`
line on stderr says so and suggests `--source` per owner (still exit 0, the file written).
A registry of one owner, or an export with `--source`, gets no such note.
"""

from __future__ import annotations

from pathlib import Path

from cli_run import Run
from click.testing import CliRunner

from emq_bridge import Repeat
from emq_bridge.cli import cli
from emq_bridge.template import TaskTemplate

TASK = TaskTemplate("app.t").to_dict()
NOTE = (
    "note: these schedules have 2 owners ('app-a', 'app-b') and the file declares none: a "
    "sync of it takes every one over to the file's source (file:<its name>); export each "
    "owner with --source to keep them apart"
)


def test_an_export_of_several_owners_without_source_notes_the_take_over(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    repeat.upsert("celery", "a1", every="1m", template=TASK, source="app-a")
    repeat.upsert("celery", "b1", every="1m", template=TASK, source="app-b")
    out = tmp_path / "all.toml"

    exported = run("export", "-o", str(out))
    assert exported.exit_code == 0, exported.output
    assert exported.stderr.splitlines() == [NOTE, "exported 2 schedule(s), 0 left out"]
    assert out.exists() and not out.read_text().startswith("source")

    # What the note says: the sync of that file re-owns both schedules.
    synced = run("sync", str(out))
    assert synced.exit_code == 0, synced.output
    assert {r.source for r in repeat.iter_list("celery")} == {"file:all.toml"}


def test_an_export_of_one_owner_or_with_source_has_no_owners_note(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    repeat.upsert("celery", "a1", every="1m", template=TASK, source="app-a")
    repeat.upsert("reports", "a2", every="1m", template=TASK, source="app-a")
    alone = run("export", "-o", str(tmp_path / "a.toml"))
    assert alone.exit_code == 0, alone.output
    assert alone.stderr.splitlines() == ["exported 2 schedule(s), 0 left out"]

    repeat.upsert("celery", "b1", every="1m", template=TASK, source="app-b")
    for owner in ("app-a", "app-b"):
        one = run("export", "--source", owner, "-o", str(tmp_path / f"{owner}.toml"))
        assert one.exit_code == 0, one.output
        assert not any(line.startswith("note:") for line in one.stderr.splitlines())
        assert (tmp_path / f"{owner}.toml").read_text().startswith(f'source = "{owner}"')


def test_the_note_says_schedules_of_no_owner_are_in_no_source_export(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    # Session 34 (a probe of moving the registry): following the note, each owner exported
    # with --source, left the schedules added at run time (no owner) out, without a word.
    repeat.upsert("celery", "a1", every="1m", template=TASK, source="app-a")
    repeat.upsert("celery", "added", every="1m", template=TASK)  # the CLI, the API
    exported = run("export", "-o", str(tmp_path / "all.toml"))
    assert exported.exit_code == 0, exported.output
    [note] = [line for line in exported.stderr.splitlines() if line.startswith("note:")]
    assert note.startswith("note: these schedules have 2 owners ('app-a', none)")
    assert note.endswith(
        "those of no owner (added at run time: the CLI, the API) are in no --source export: "
        "a file always declares an owner, so they come back owned by the file's"
    )


def test_an_export_notes_the_paused_schedules_it_writes_as_definitions(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    repeat.upsert("celery", "a1", every="1m", template=TASK, source="app-a")
    repeat.upsert("celery", "a2", every="1m", template=TASK, source="app-a")
    repeat.pause("celery", "a2", note="until the migration")
    exported = run("export", "--source", "app-a", "-o", str(tmp_path / "a.toml"))
    assert exported.exit_code == 0, exported.output
    assert exported.stderr.splitlines() == [
        "note: 1 paused schedule(s) are written as definitions only: synced into a registry "
        "that does not hold them, they are active",
        "exported 2 schedule(s), 0 left out",
    ]


def test_an_export_notes_the_one_offs_whose_run_is_still_to_come(
    run: Run, repeat: Repeat, tmp_path: Path, redis_url: str
) -> None:
    # Session 38 (a probe of the migration round trip): a one-off imported overdue, pending
    # in its registry, came back complete from its file synced elsewhere, never run, and the
    # export said nothing. The note says it; what it says is what the sync does.
    import time
    from datetime import datetime, timedelta, timezone

    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    repeat.upsert("celery", "once", at=soon, template=TASK, source="app-a")
    repeat.upsert("celery", "every", every="1m", template=TASK, source="app-a")
    path = tmp_path / "a.json"
    exported = run("export", "--source", "app-a", "--format", "json", "-o", str(path))
    assert exported.exit_code == 0, exported.output
    assert exported.stderr.splitlines() == [
        "note: 1 one-off schedule(s) with a run still to come are written as definitions "
        "only: synced into a registry that does not hold them, a run whose time has passed "
        "by then is not sent (the schedule is complete)",
        "exported 2 schedule(s), 0 left out",
    ]
    time.sleep(max(0.0, soon.timestamp() - time.time()) + 0.2)
    # A registry of its own under the test's prefix (dropped with it).
    elsewhere = Repeat(repeat.client, f"{repeat.prefix}b")
    synced = CliRunner().invoke(
        cli, ["--redis-url", redis_url, "--prefix", elsewhere.prefix, "sync", str(path)]
    )
    assert synced.exit_code == 0, synced.output
    once = elsewhere.get("celery", "once")
    assert once is not None and once.completed and once.fired == 0


def test_an_export_notes_the_schedules_whose_limit_ran_here(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    # Session 40 (migration probe): a django-celery-beat one-off imported as a limit of 1 ran
    # here; exported and synced into another registry it ran again, and the export said
    # nothing. The file holds definitions; the note says so of those whose limit ran.
    from emq_bridge import Pump
    from emq_bridge.testing import RecordingDispatcher

    repeat.upsert("celery", "once", every="1m", limit=1, template=TASK, source="app-a")
    repeat.upsert("celery", "plenty", every="1m", limit=5, template=TASK, source="app-a")
    repeat.upsert("celery", "every", every="1m", template=TASK, source="app-a")
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["celery"], sent)
    pump.run_once(now_ms=repeat.server_time_ms() + 61_000)
    assert {o.name for o in sent.clear()} == {"once", "plenty", "every"}
    once = repeat.get("celery", "once")
    assert once is not None and once.completed is not None
    exported = run("export", "--source", "app-a", "-o", str(tmp_path / "a.toml"))
    assert exported.exit_code == 0, exported.output
    assert (
        "note: 2 schedule(s) with a limit of runs made some of them here (1 completed): "
        "written as definitions only, synced into a registry that does not hold them, they "
        "run their whole limit again (a one-off imported from django-celery-beat is a limit "
        "of 1)"
    ) in exported.stderr.splitlines()
