"""Registrations that a Redis eviction (or a hand `DEL`/`ZREM`) left half-stored, which a
memory-pressure probe found lost for good.

Before: a sync stamp held over a queue whose registry sorted set was gone (the `synced` hash
kept), so every boot and `emq-bridge sync FILE` said "unchanged ... nothing read" and nothing
fired again; a record whose member was gone showed `state active`, `next run -`, and `add`
said "exists (identical)"; `list` and `export` left out a member whose record was gone with
no line (`export`: "0 left out").

Now a stamp holds only while each queue of the source's schedules has at least as many
registry members as its sync left there; a full sync puts back the member of an unchanged
record that lost it (at its next run, named in one WARNING line; paused and completed ones
at +inf, as they were); `show` says such a record is not scheduled and how to put it back;
`list` and `export` name a member without its record on stderr, and `export` counts it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner

from emq_bridge import Declaration, Repeat, define, sync
from emq_bridge.keys import synced_key
from emq_bridge.sync import Stamp, stamped

SOURCE = "app"
QUEUE = "reports"
MINUTE = 60_000
MISSING = "its record is missing (a registry member without its record"


def declarations(queue: str = QUEUE, n: int = 3, prefix: str = "job") -> list[Declaration]:
    return [
        Declaration(queue, f"{prefix}-{i}", define(every="1m", template={"task": "t", "args": [i]}))
        for i in range(n)
    ]


def stamp(declared: list[Declaration]) -> Stamp:
    return Stamp.of_queues("f1", declared)


def writes(repeat: Repeat) -> int:
    return int(repeat.client.info("persistence")["rdb_changes_since_last_save"])


def scores(repeat: Repeat, queue: str = QUEUE) -> dict[str, float]:
    return {
        name.decode(): score
        for name, score in repeat.client.zrange(repeat.keys(queue).registry, 0, -1, withscores=True)
    }


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == logger
    ]


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


# -- 1. a stamp does not hold over a registry that lost members ------------------------------


def test_a_stamp_does_not_hold_once_the_registry_sorted_set_is_gone(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    declared = declarations()
    sync(repeat, declared, SOURCE, stamp=stamp(declared))
    before = scores(repeat)
    assert stamped(repeat, SOURCE, "f1") is not None
    repeat.client.delete(repeat.keys(QUEUE).registry)  # eviction took it; `synced` kept

    assert stamped(repeat, SOURCE, "f1") is None
    with caplog.at_level(logging.WARNING, logger="emq_bridge.sync"):
        plan = sync(repeat, declared, SOURCE, stamp=stamp(declared))

    assert sorted(d.name for d in plan.restored) == ["job-0", "job-1", "job-2"]
    now = repeat.server_time_ms()
    after = scores(repeat)
    assert sorted(after) == sorted(before)
    # Each at its next slot under its cadence: on the minute grid, after now.
    assert all(now < s <= now + MINUTE and s % MINUTE == 0 for s in after.values())
    assert len(warnings_of(caplog, "emq_bridge.sync")) == 1
    # Stamped again: the next boot reads nothing and writes nothing.
    assert stamped(repeat, SOURCE, "f1") is not None
    written = writes(repeat)
    again = sync(repeat, declared, SOURCE, stamp=True)
    assert not again.by_stamp  # (another fingerprint: a full sync, which finds all unchanged)
    assert again.changes == 0 and writes(repeat) > written  # its own stamp written once
    written = writes(repeat)
    assert sync(repeat, declared, SOURCE, stamp=True).by_stamp
    assert writes(repeat) == written


def test_a_member_lost_in_a_queue_the_source_has_alone_breaks_its_stamp(repeat: Repeat) -> None:
    declared = declarations()
    sync(repeat, declared, SOURCE, stamp=stamp(declared))
    repeat.client.zrem(repeat.keys(QUEUE).registry, "job-1")

    assert stamped(repeat, SOURCE, "f1") is None
    plan = sync(repeat, declared, SOURCE, stamp=stamp(declared))

    assert [d.name for d in plan.restored] == ["job-1"]
    assert sorted(d.name for d in plan.unchanged) == ["job-0", "job-2"]
    assert sorted(scores(repeat)) == ["job-0", "job-1", "job-2"]
    assert stamped(repeat, SOURCE, "f1") is not None


def test_a_stamp_still_holds_in_a_shared_queue_with_paused_and_completed_schedules(
    repeat: Repeat,
) -> None:
    ours, theirs = declarations(), declarations(n=2, prefix="their")
    once = Declaration(QUEUE, "once", define(at=["2020-01-01T00:00Z"], template={"task": "t"}))
    sync(repeat, [*ours, once], SOURCE, stamp=stamp([*ours, once]))
    sync(repeat, theirs, "other", stamp=Stamp("f2", {}))
    repeat.register(QUEUE, "runtime", every="1h", template={"task": "t"})
    repeat.pause(QUEUE, "job-0")
    repeat.pause(QUEUE, "their-1")
    repeat.cancel(QUEUE, "runtime")
    assert repeat.read(QUEUE, "once").completed is not None

    assert stamped(repeat, SOURCE, "f1") is not None
    assert stamped(repeat, "other", "f2") is not None
    # A loss the other source's members outnumber is not seen by the stamp (one ZCARD): a
    # sync that reads (one with another fingerprint, `sync FILE --json`) finds it.
    repeat.client.zrem(repeat.keys(QUEUE).registry, "job-2")
    assert stamped(repeat, "other", "f2") is not None
    assert [d.name for d in sync(repeat, ours, SOURCE, prune=False).restored] == ["job-2"]


def test_a_stamp_without_counts_or_over_a_broken_registry_key_does_not_hold(
    repeat: Repeat,
) -> None:
    declared = declarations()
    sync(repeat, declared, SOURCE, stamp=stamp(declared))
    key = synced_key(repeat.prefix, SOURCE)
    record = json.loads(repeat.client.get(key) or b"")
    assert record["declared"] == {QUEUE: 3}
    for edited in (
        {k: v for k, v in record.items() if k != "declared"},
        {**record, "declared": [3]},
    ):
        repeat.client.set(key, json.dumps(edited))  # a record of an earlier version, or edited
        assert stamped(repeat, SOURCE, "f1") is None
    sync(repeat, declared, SOURCE, stamp=stamp(declared))
    assert stamped(repeat, SOURCE, "f1") is not None
    registry = repeat.keys(QUEUE).registry
    repeat.client.delete(registry)
    repeat.client.set(registry, "x")  # another type: no stamp, no error (the sync says it)
    assert stamped(repeat, SOURCE, "f1") is None


def test_sync_file_puts_back_a_registry_eviction_took(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'source = "mpfile"\n'
        + "".join(
            f'[[schedule]]\nqueue = "jobs"\nname = "{n}"\ntask = "t.{n}"\nevery = "2s"\n'
            for n in "bc"
        )
    )
    assert run("sync", str(path)).exit_code == 0
    repeat.client.zrem(repeat.keys("jobs").registry, "b")

    result = run("sync", str(path))

    assert result.exit_code == 0, result.output
    assert "~ jobs/b  every 2s  (recreated)" in result.stdout
    assert "1 updated" in result.stderr and "nothing read" not in result.stderr
    assert sorted(scores(repeat, "jobs")) == ["b", "c"]
    assert "nothing read" in run("sync", str(path)).stderr  # stamped again


# -- 2. a full sync restores an unchanged record's member; show says the truth ---------------


def test_a_full_sync_restores_each_lost_member_as_its_state_holds_it(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    cron = Declaration(QUEUE, "cron", define(cron="*/5 * * * *", template={"task": "t"}))
    once = Declaration(QUEUE, "once", define(at=["2020-01-01T00:00Z"], template={"task": "t"}))
    declared = [*declarations(), cron, once]
    sync(repeat, declared, SOURCE)
    repeat.pause(QUEUE, "job-2", note="on purpose")
    now = repeat.server_time_ms()
    slot = (now // MINUTE + 1) * MINUTE  # job-1's next slot: as if fired already
    repeat.client.hset(repeat.keys(QUEUE).record("job-1"), "last_due_ms", slot)
    registry = repeat.keys(QUEUE).registry
    repeat.client.zrem(registry, "job-0", "job-1", "job-2", "cron", "once")

    with caplog.at_level(logging.WARNING, logger="emq_bridge.sync"):
        plan = sync(repeat, declared, SOURCE)

    assert sorted(d.name for d in plan.restored) == ["cron", "job-0", "job-1", "job-2", "once"]
    assert plan.restored[0] in plan.update and not plan.create
    [line] = warnings_of(caplog, "emq_bridge.sync")
    assert "5 schedule(s) restored" in line and "reports/job-0" in line and "missing" in line
    after = scores(repeat)
    assert now < after["job-0"] <= slot
    assert after["job-1"] == slot + MINUTE  # after its last fired slot, not at it
    assert after["cron"] % (5 * MINUTE) == 0 and after["cron"] > now
    assert after["job-2"] == float("inf") and after["once"] == float("inf")
    assert repeat.read(QUEUE, "job-2").paused and repeat.read(QUEUE, "job-2").paused_note
    assert repeat.read(QUEUE, "once").completed is not None
    # Nothing else changed, and the next full sync writes nothing.
    written = writes(repeat)
    assert sync(repeat, declared, SOURCE).changes == 0
    assert writes(repeat) == written


def test_the_api_upsert_still_calls_a_member_put_back_an_update(repeat: Repeat) -> None:
    repeat.upsert(QUEUE, "d", every="1m", template={"task": "t"})
    repeat.client.zrem(repeat.keys(QUEUE).registry, "d")
    assert repeat.upsert(QUEUE, "d", every="1m", template={"task": "t"}) == "updated"
    assert "d" in scores(repeat)
    assert repeat.upsert(QUEUE, "d", every="1m", template={"task": "t"}) == "unchanged"


def test_show_and_add_say_a_record_without_its_member_is_not_scheduled(
    run: Run, repeat: Repeat
) -> None:
    assert run("add", QUEUE, "b", "--task", "t.b", "--every", "1h").exit_code == 0
    repeat.client.zrem(repeat.keys(QUEUE).registry, "b")

    shown = run("show", QUEUE, "b")
    as_json = json.loads(run("show", QUEUE, "b", "--json").stdout)
    added = run("add", QUEUE, "b", "--task", "t.b", "--every", "1h")

    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[2].split(None, 1) == [
        "state",
        "not scheduled: its registry member is missing (evicted, or deleted by hand), so "
        "nothing fires it",
    ]
    assert lines[3].strip() == (
        f"put it back: emq-bridge pause {QUEUE} b, then emq-bridge resume {QUEUE} b"
    )
    assert "next run  - (not scheduled)" in shown.stdout
    assert as_json["state"] == "unscheduled" and as_json["unscheduled"] is True
    assert added.exit_code == 0 and "exists reports/b (identical" in added.stdout
    assert "note: reports/b is not scheduled" in added.stderr
    # The way out the line gives works.
    assert run("pause", QUEUE, "b").exit_code == 0
    assert run("resume", QUEUE, "b").exit_code == 0
    registration = repeat.read(QUEUE, "b")
    assert not registration.unscheduled and registration.next_run_ms is not None
    assert json.loads(run("show", QUEUE, "b", "--json").stdout)["state"] == "active"


# -- 3. list and export name a member without its record -------------------------------------


@pytest.fixture
def member_only(run: Run, repeat: Repeat, client: redis.Redis) -> None:
    for name in ("a", "c"):
        assert run("add", QUEUE, name, "--task", "t", "--every", "1h").exit_code == 0
    client.delete(repeat.keys(QUEUE).record("a"))


@pytest.mark.usefixtures("member_only")
def test_list_leaves_a_member_without_its_record_out_with_one_line(
    run: Run, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        listed = run("list")
        as_json = run("list", "--json")

    assert listed.exit_code == 0 and as_json.exit_code == 0
    assert " c " in listed.stdout and " a " not in listed.stdout
    assert [r["name"] for r in json.loads(as_json.stdout)] == ["c"]
    found = warnings_of(caplog, "emq_bridge.registry")
    assert len(found) == 2 and all(f"reports/a skipped: {MISSING}" in m for m in found)
    assert [r.name for r in repeat.list(QUEUE)] == ["c"]
    rows = {name: (r, error) for r, name, _, error in repeat.iter_checked(QUEUE)}
    assert rows["a"][0] is None and rows["a"][1].startswith(MISSING)
    assert repeat.get(QUEUE, "a") is None  # a name asked for, not listed: none, as before


@pytest.mark.usefixtures("member_only")
def test_export_counts_a_member_without_its_record_as_left_out(run: Run, tmp_path: Path) -> None:
    out = tmp_path / "x.toml"

    result = run("export", "-o", str(out))

    assert result.exit_code == 0, result.output
    assert f"! reports/a: {MISSING}" in result.stderr
    assert "exported 1 schedule(s), 1 left out" in result.stderr
    assert 'name = "c"' in out.read_text() and 'name = "a"' not in out.read_text()


@pytest.mark.usefixtures("member_only")
def test_pause_all_and_resume_all_name_a_member_without_its_record(
    run: Run, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        paused = run("pause", QUEUE, "--all")
        resumed = run("resume", QUEUE, "--all")

    assert paused.stdout.split() == ["paused", "1", "in", QUEUE, "c"]
    assert resumed.stdout.split() == ["resumed", "1", "in", QUEUE, "c"]
    found = warnings_of(caplog, "emq_bridge.registry")
    assert [m.split(":", 1)[0] for m in found] == [
        "reports/a left as it is, not paused",
        "reports/a left as it is, not resumed",
    ]
    assert run("remove", QUEUE, "a").exit_code == 0  # the way out the line gives
    assert sorted(scores(repeat)) == ["c"]


def test_a_changed_declaration_whose_member_was_missing_is_restored_and_said_so(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    """The upgrade's first full sync rewrites reordered templates: a record that had lost
    its member and changes at once was an update diffed against nothing ("an unreadable
    cadence -> every 1h, ... owner (none) -> app"), not named among the restored, and the
    slots passed meanwhile went unsaid (found by a probe of the upgrade)."""
    first = Declaration("rq", "job", define(every="1h", template={"task": "t", "kwargs": {"a": 1}}))
    sync(repeat, [first], "app")
    repeat.client.zrem(repeat.keys("rq").registry, "job")
    changed = Declaration(
        "rq", "job", define(every="1h", template={"task": "t", "kwargs": {"a": 2}})
    )
    caplog.set_level(logging.INFO, logger="emq_bridge")
    applied = sync(repeat, [changed], "app")
    assert [d.name for d in applied.restored] == ["job"]
    assert repeat.client.zscore(repeat.keys("rq").registry, "job") is not None
    assert "1 schedule(s) restored: rq/job" in caplog.text
    assert "an unreadable cadence" not in caplog.text
    assert repeat.get("rq", "job").definition.template["kwargs"] == {"a": 2}
