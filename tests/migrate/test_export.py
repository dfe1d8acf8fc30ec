"""`emq-bridge export`: the registry written as a schedule file that `sync` reads back into
an empty registry as identical registrations (digests), on 10,000 mixed registrations
(jitter, exclusions, named calendars, H and 6-field crons among them); what a file cannot
carry is listed, never written changed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import Run
from quiet import quiet_offset

from emq_bridge import Repeat
from emq_bridge.calendars import Calendar, ExcludeItem
from emq_bridge.config import sync_file
from emq_bridge.definition import DEFINITION_FIELDS, Definition, define
from emq_bridge.migrate.export import CARRIED_FIELDS, REFUSED_FIELDS, export_registry, render
from emq_bridge.template import TaskTemplate

QUEUES = ("reports", "billing", "mail", "default", "ünïcode-q")
ZONES = ("UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe")
START = datetime(2027, 1, 1, tzinfo=timezone.utc)
# Two calendars that share a rule (a rule's first occurrence is the one kept).
HOLIDAYS = Calendar("holidays", ["2027-12-25", "2027-12-31..2028-01-01", "cron:* * 1 5 *"])
FREEZE = Calendar("freeze", ["2027-11-26T18:00..2027-11-29T06:00", "2027-12-25"])
EXCLUDES: tuple[list[ExcludeItem], ...] = (
    [],
    [HOLIDAYS],
    [HOLIDAYS, "cron:* * 24 12 *"],
    ["2027-07-04", FREEZE],
    [FREEZE, HOLIDAYS],
    ["2027-08-15", "2027-08-01..2027-08-03"],
)


def mixed(i: int) -> Definition:
    """Registration i of a mixed registry: intervals (three anchors, offsets), crons in
    zones (day AND, H, seconds), one-offs, misfire and overlap policies, bounds, nested
    arguments, jitter, exclusion rules and named calendars."""
    template = TaskTemplate(
        f"app.tasks.job_{i % 97}",
        [i, f"arg-{i}", [1.5, True]] if i % 3 else [],
        # A table last: TOML writes an object's tables after its plain keys (see
        # test_export_toml_order_s28.py for one that would come back reordered).
        {"n": i, "flag": i % 2 == 0, "nested": {"deep": [i, {"x": "é"}]}} if i % 4 else {},
        {"priority": i % 10, "expires": 60} if i % 5 == 0 else {},
    ).to_dict()
    policies: dict[str, Any] = {
        "misfire": ("coalesce", "catchup")[i % 2],
        "overlap": ("allow", "skip", "buffer_one", "replace")[i % 4],
        "pause_after_failures": (None, 3)[i % 2],
    }
    if i % 7 == 0:
        policies["start_at"] = START + timedelta(hours=i)
    if i % 11 == 0:
        policies["end_at"] = START + timedelta(days=400 + i)
    kind = i % 4
    shaping: dict[str, Any] = {"exclude": EXCLUDES[i // 4 % len(EXCLUDES)] or None}
    if i % 3 == 0 and kind != 1:  # jitter needs a grid: not anchor="release"
        shaping["jitter"] = (f"{1 + i % 30}s", "1500ms", "1m")[i // 3 % 3]
    if kind == 0:
        return define(
            every=f"{1 + i % 90}m",
            anchor="grid",
            offset=i % 60,
            template=template,
            **policies,
            **shaping,
        )
    if kind == 1:
        return define(
            every_ms=1000 + i,
            anchor=("schedule", "release")[i % 2],
            template=template,
            **policies,
            **shaping,
        )
    if kind == 2:
        cron = (
            f"{i % 60} {i % 24} * * {i % 7}",
            f"H H({i % 12}-{12 + i % 12}) * * {i % 7}",  # H: seeded with the name
            f"{i % 60} {i % 60} {i % 24} * * {i % 7}",  # seconds first
        )[i // 4 % 3]
        return define(
            cron=cron,
            tz=ZONES[i % len(ZONES)],
            day_and=i % 3 == 0,
            template=template,
            **policies,
            **shaping,
        )
    policies.pop("start_at", None)
    policies.pop("end_at", None)
    return define(
        at=[START + timedelta(minutes=i), START + timedelta(days=1, minutes=i)],
        template=template,
        **policies,
    )


def digests(repeat: Repeat) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    return {(q, n): d for q in repeat.queues() for n, d in repeat.digests(q).items()}


@pytest.mark.parametrize(("fmt", "count"), [("toml", 10_000), ("json", 2_000)])
def test_an_export_synced_into_an_empty_registry_gives_identical_registrations(
    repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str, count: int
) -> None:
    # 10,000 through TOML; JSON is the same document through another serializer.
    items = [(QUEUES[i % len(QUEUES)], f"job-{i}-é", mixed(i)) for i in range(count)]
    assert set(repeat.upsert_many(items, source="app")) == {"created"}

    export = export_registry(repeat, fmt=fmt)  # type: ignore[arg-type]
    assert export.refused == []
    assert export.source == "app" and len(export.entries) == count
    # Each calendar once, with its own rules, whichever schedules share a rule with it.
    assert export.document()["calendars"] == {c.name: list(c.exclude) for c in (FREEZE, HOLIDAYS)}
    assert {"jitter", "exclude"} <= {k for e in export.entries for k in e}
    path = tmp_path / f"schedules.{fmt}"
    path.write_text(render(export, fmt), encoding="utf-8")  # type: ignore[arg-type]

    empty = Repeat(client, f"{prefix}x")
    plan = sync_file(empty, path)
    assert (len(plan.create), plan.changes) == (count, count)
    assert digests(empty) == digests(repeat)  # definitions and owner, each registration


def test_what_a_file_cannot_carry_is_listed_and_left_out(
    run: Run, repeat: Repeat, prefix: str, tmp_path: Path
) -> None:
    task = TaskTemplate("app.t").to_dict()
    repeat.upsert("q", "plain", every="1m", template=task, source="ops")
    repeat.upsert("q", "null-arg", every="1m", template={**task, "args": [None]}, source="ops")
    repeat.upsert("q", "raw", every="1m", template={"task": "app.t"}, source="ops")
    repeat.upsert("q", "custom", every="1m", template={**task, "schedule": "x"}, source="ops")

    toml = run("export", "-o", str(tmp_path / "s.toml"))
    assert toml.exit_code == 0, toml.output
    assert "exported 1 schedule(s), 3 left out" in toml.stderr
    assert "! q/null-arg: it holds a null, which TOML cannot write" in toml.stderr
    assert "! q/raw: its template has no args, kwargs, options" in toml.stderr
    assert "! q/custom: its template holds schedule besides" in toml.stderr
    as_json = run("export", "q", "--format", "json")
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    # Two of ops's schedules are left out, which a sync of a file declaring ops would remove:
    # the file does not declare it, and says why.
    assert "source" not in document
    assert "note: the file does not declare source 'ops': 2 of its schedules" in as_json.stderr
    assert [e["name"] for e in document["schedule"]] == ["null-arg", "plain"]

    (tmp_path / "s.json").write_text(as_json.stdout)
    synced = run("--prefix", f"{prefix}y", "sync", str(tmp_path / "s.json"))
    assert synced.exit_code == 0, synced.output
    assert "2 created, 0 updated, 0 removed, 0 unchanged" in synced.stderr


def test_export_only_a_source_and_the_file_declares_it(run: Run, repeat: Repeat) -> None:
    task = TaskTemplate("app.t").to_dict()
    repeat.upsert("q", "mine", cron="0 9 * * *", tz="Europe/Paris", template=task, source="a")
    repeat.upsert("q", "theirs", every="5m", template=task, source="b")
    result = run("export", "--source", "a")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith('source = "a"\n')
    assert 'name = "mine"' in result.stdout and "theirs" not in result.stdout


def test_a_file_that_would_leave_out_some_of_its_source_never_declares_it(
    run: Run, repeat: Repeat, prefix: str, tmp_path: Path
) -> None:
    # A file that declares a source removes, at its sync, what it leaves out of that source.
    task = TaskTemplate("app.t").to_dict()
    for queue, name in (("rq", "a"), ("rq", "b"), ("emails", "retry")):
        repeat.upsert(queue, name, every="1m", template=task, source="rich")
    before = digests(repeat)

    partial = run("export", "rq", "--source", "rich", "-o", str(tmp_path / "rq.toml"))
    assert partial.exit_code == 1, partial.output
    [line] = partial.stderr.strip().splitlines()
    assert "--source rich: 1 of its schedules would be left out (1 in queues not exported)" in (
        line
    )
    assert not (tmp_path / "rq.toml").exists()
    typo = run("export", "rqq", "--source", "rich")
    assert typo.exit_code == 1 and "3 of its schedules would be left out" in typo.stderr

    shared = run("export", "rq", "-o", str(tmp_path / "shared.toml"))  # rq's owner, not declared
    assert shared.exit_code == 0, shared.output
    assert "note: the file does not declare source 'rich'" in shared.stderr
    assert not (tmp_path / "shared.toml").read_text().startswith("source")
    dry = run("sync", str(tmp_path / "shared.toml"), "--dry-run")
    assert dry.exit_code == 0 and "0 removed" in dry.stderr, dry.output
    nothing = run("export", "nowhere")
    assert nothing.exit_code == 0 and "note: queue 'nowhere' has no schedule" in nothing.stderr

    whole = run("export", "rq", "emails", "--source", "rich", "-o", str(tmp_path / "all.toml"))
    assert whole.exit_code == 0, whole.output
    synced = run("sync", str(tmp_path / "all.toml"))
    assert "0 created, 0 updated, 0 removed, 3 unchanged" in synced.stderr, synced.output
    assert digests(repeat) == before

    unwritable = run("export", "-o", str(tmp_path / "no" / "such" / "dir.toml"))
    assert unwritable.exit_code == 1
    [line] = unwritable.stderr.strip().splitlines()
    assert line.startswith("Error: cannot write ") and "No such file or directory" in line


def round_trip(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str
) -> dict[str, Any]:
    """Export the test registry with the CLI in `fmt`, sync the file into an empty registry,
    check the digests are the same; return the file as a document."""
    path = tmp_path / f"schedules.{fmt}"
    exported = run("export", "--format", fmt, "-o", str(path))
    assert exported.exit_code == 0, exported.output
    assert "0 left out" in exported.stderr, exported.stderr
    synced = run("--prefix", f"{prefix}x", "sync", str(path))
    assert synced.exit_code == 0, synced.output
    assert digests(Repeat(client, f"{prefix}x")) == digests(repeat)
    text = path.read_text(encoding="utf-8")
    if fmt == "json":
        return dict(json.loads(text))
    import tomllib

    return dict(tomllib.loads(text))


TASK = TaskTemplate("app.t").to_dict()
FORMATS = pytest.mark.parametrize("fmt", ["toml", "json"])


@FORMATS
def test_a_jittered_registration_comes_back_with_its_jitter(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str
) -> None:
    # The interval's slot far from now: one passing between the upsert here and the sync of
    # the file would start the synced copy a slot later.
    interval = define(every="15m", offset=quiet_offset("15m"), jitter="90s", template=TASK)
    for name, definition in (
        ("interval", interval),
        ("cron", define(cron="0 9 * * 1-5", tz="Europe/Paris", jitter=1.5, template=TASK)),
    ):
        repeat.upsert("q", name, definition=definition, source="app")
    document = round_trip(run, repeat, client, prefix, tmp_path, fmt)
    assert [e["jitter"] for e in document["schedule"]] == ["1500ms", "90s"]
    # The same jittered slot: the offset is hashed from the name, which the file keeps.
    synced = Repeat(client, f"{prefix}x")
    for name in ("interval", "cron"):
        ours, theirs = repeat.get("q", name), synced.get("q", name)
        assert ours is not None and theirs is not None
        assert theirs.next_run_ms == ours.next_run_ms


@FORMATS
def test_an_excluded_registration_comes_back_with_its_rules_in_order(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str
) -> None:
    rules = [
        "2027-12-25",
        "2027-12-20..2027-12-22",
        "cron:* * * * 0,6",
        "2027-11-27T18:00..2027-11-30T06:00",
    ]
    definition = define(cron="30 8 * * *", tz="Europe/Paris", exclude=rules, template=TASK)
    repeat.upsert("q", "weekdays", definition=definition, source="app")
    document = round_trip(run, repeat, client, prefix, tmp_path, fmt)
    assert document["schedule"][0]["exclude"] == rules
    assert "calendars" not in document


@FORMATS
def test_a_calendar_shared_by_schedules_is_written_once_and_named(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str
) -> None:
    schedules = {
        "a": define(every="1h", exclude=[HOLIDAYS], template=TASK),
        "b": define(cron="0 9 * * *", tz="Europe/Paris", exclude=[HOLIDAYS], template=TASK),
        # Its own rules around two calendars that share 2027-12-25 (kept once, first).
        "c": define(every="1d", exclude=["2027-07-04", FREEZE, HOLIDAYS], template=TASK),
        "d": define(every="1d", exclude=[FREEZE], template=TASK),
    }
    for name, definition in schedules.items():
        repeat.upsert("q", name, definition=definition, source="app")
    document = round_trip(run, repeat, client, prefix, tmp_path, fmt)
    assert document["calendars"] == {
        "freeze": list(FREEZE.exclude),
        "holidays": list(HOLIDAYS.exclude),
    }
    assert [e["exclude"] for e in document["schedule"]] == [
        ["@holidays"],
        ["@holidays"],
        ["2027-07-04", "@freeze", "@holidays"],
        ["@freeze"],
    ]
    text = (tmp_path / f"schedules.{fmt}").read_text(encoding="utf-8")
    assert text.count("2027-12-31..2028-01-01") == 1  # the calendar's rules once


def test_a_calendar_that_differs_between_schedules_keeps_each_schedules_rules(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    # Two sources declared "holidays" differently: the file's calendar holds what they
    # share, and each schedule lists the rest itself, so each keeps its digest.
    older = Calendar("holidays", ["2027-12-25"])
    for name, calendar in (("new", HOLIDAYS), ("old", older)):
        definition = define(every="1h", exclude=[calendar], template=TASK)
        repeat.upsert("q", name, definition=definition, source="app")
    document = round_trip(run, repeat, client, prefix, tmp_path, "json")
    assert document["calendars"] == {"holidays": ["2027-12-25"]}
    assert [e["exclude"] for e in document["schedule"]] == [
        ["@holidays", *HOLIDAYS.exclude[1:]],
        ["@holidays"],
    ]


@FORMATS
def test_an_h_cron_comes_back_seeded_with_its_name(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str
) -> None:
    repeat.upsert("q", "hourly", cron="H * * * *", template=TASK, source="app")
    repeat.upsert("q", "seconds", cron="H H/15 * * * *", template=TASK, source="app")
    repeat.upsert(
        "q",
        "spread",
        definition=define(cron="H H(8-10) * * 1-5", jitter="30s", template=TASK),
        source="app",
    )
    document = round_trip(run, repeat, client, prefix, tmp_path, fmt)
    assert [e["cron"] for e in document["schedule"]] == [
        "H * * * *",
        "H H/15 * * * *",
        "H H(8-10) * * 1-5",
    ]
    assert all("seed" not in e for e in document["schedule"])  # the name is the seed
    synced = Repeat(client, f"{prefix}x")
    for name in ("hourly", "seconds", "spread"):
        assert synced.next_runs("q", name) == repeat.next_runs("q", name)


def test_a_seed_other_than_the_name_and_a_custom_schedule_are_refused_with_the_reason(
    run: Run, repeat: Repeat
) -> None:
    from emq_bridge.celery.entries import CelerySchedule

    class EveryMinute:  # a custom Celery schedule (duck-typed): a file cannot declare it
        def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
            return False, 60.0

    custom = Definition(CelerySchedule(EveryMinute(), "<EveryMinute>"), TASK)
    repeat.upsert("q", "custom", definition=custom, source="app")
    seeded = define(cron="H 9 * * *", seed="shared", template=TASK)
    repeat.upsert("q", "seeded", definition=seeded, source="app")
    repeat.upsert("q", "plain", definition=define(every="1m", jitter="5s", template=TASK))
    result = run("export", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "! q/custom: its cadence is a custom Celery schedule object" in result.stderr
    assert "! q/seeded: its H or jitter is seeded with 'shared', not its name" in result.stderr
    assert "exported 1 schedule(s), 2 left out" in result.stderr
    assert [e["name"] for e in json.loads(result.stdout)["schedule"]] == ["plain"]


def test_every_definition_field_is_carried_or_refused_with_a_reason() -> None:
    # A field added to DEFINITION_FIELDS is exported, or refused by name: never dropped.
    assert set(DEFINITION_FIELDS) <= CARRIED_FIELDS | set(REFUSED_FIELDS)
    assert not CARRIED_FIELDS & set(REFUSED_FIELDS)
