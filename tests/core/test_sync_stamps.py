"""Sync stamps (stamps.py): a stamp holds while nobody but the stamped sync wrote its source's
records, in any queue; every other write of them, however it is made, makes the next boot
sync in full."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import pytest

from emq_bridge import Declaration, Repeat, define, sync
from emq_bridge.keys import synced_key
from emq_bridge.sync import Stamp, declarations_fingerprint, stamped

SOURCE = "app"
STAMP = Stamp("f1", {"queues": ["reports"], "declared": 3})


def declarations(every: str = "1m", queue: str = "reports") -> list[Declaration]:
    return [
        Declaration(queue, f"job-{i}", define(every=every, template={"task": "t", "args": [i]}))
        for i in range(3)
    ]


def writes(repeat: Repeat) -> int:
    return int(repeat.client.info("persistence")["rdb_changes_since_last_save"])


def test_a_stamped_sync_is_found_by_its_fingerprint_only(any_repeat: Repeat) -> None:
    assert stamped(any_repeat, SOURCE, "f1") is None  # never synced
    sync(any_repeat, declarations(), SOURCE, stamp=STAMP)

    assert stamped(any_repeat, SOURCE, "f1") == {"queues": ["reports"], "declared": 3}
    assert stamped(any_repeat, SOURCE, "f2") is None
    assert stamped(any_repeat, "other", "f1") is None


def test_reading_a_stamp_writes_nothing_and_a_full_unchanged_sync_keeps_it(
    repeat: Repeat,
) -> None:
    sync(repeat, declarations(), SOURCE, stamp=STAMP)
    before = writes(repeat)
    assert stamped(repeat, SOURCE, "f1") is not None
    assert writes(repeat) == before

    plan = sync(repeat, declarations(), SOURCE, stamp=STAMP)  # a boot that could not tell

    assert len(plan.unchanged) == 3 and plan.changes == 0
    assert writes(repeat) == before  # the stamp and the counters are as they were
    assert stamped(repeat, SOURCE, "f1") is not None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda r: r.cancel("reports", "job-1"), id="cancel by hand"),
        pytest.param(
            lambda r: sync(r, declarations("2m"), SOURCE, prune=False), id="an unstamped sync"
        ),
        pytest.param(
            lambda r: r.upsert("reports", "job-2", every="5m", template={"task": "t"}),
            id="a takeover by an upsert without a source",
        ),
        pytest.param(
            lambda r: sync(r, declarations()[:1], "other", prune=False), id="another source's"
        ),
        pytest.param(
            lambda r: sync(r, declarations(queue="elsewhere"), SOURCE, prune=False),
            id="a queue the stamp never read",
        ),
    ],
)
def test_any_other_write_of_the_sources_records_breaks_the_stamp(
    any_repeat: Repeat, change: Any
) -> None:
    sync(any_repeat, declarations(), SOURCE, stamp=STAMP)
    change(any_repeat)

    assert stamped(any_repeat, SOURCE, "f1") is None
    # The full sync that follows puts the declarations back, and stamps again.
    plan = sync(any_repeat, declarations(), SOURCE, stamp=STAMP)
    assert plan.changes >= 1
    assert stamped(any_repeat, SOURCE, "f1") is not None
    assert {r.name: r.source for r in any_repeat.list("reports")} == {
        f"job-{i}": SOURCE for i in range(3)
    }


def test_writes_of_other_sources_records_leave_the_stamp_alone(any_repeat: Repeat) -> None:
    sync(any_repeat, declarations(), SOURCE, stamp=STAMP)
    any_repeat.register("reports", "runtime", every="1h", template={"task": "t"})
    sync(
        any_repeat,
        [Declaration("reports", "theirs", define(every="1h", template={"task": "u"}))],
        "other",
    )
    any_repeat.cancel("reports", "runtime")
    any_repeat.pause("reports", "job-0")  # state, not a definition: a sync does not see it
    any_repeat.trigger("reports", "job-1")

    assert stamped(any_repeat, SOURCE, "f1") is not None


def test_a_write_between_the_plan_and_the_stamp_refuses_it(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sync(repeat, declarations(), SOURCE)
    sync_module = importlib.import_module("emq_bridge.sync")  # the package's `sync` is the function
    read = sync_module._old_records

    def read_then_another_writer(repeat: Repeat, plan: Any) -> Any:
        repeat.cancel("reports", "job-0")  # after the plan read job-0 as unchanged
        return read(repeat, plan)

    monkeypatch.setattr(sync_module, "_old_records", read_then_another_writer)
    with caplog.at_level(logging.INFO, logger="emq_bridge.sync"):
        sync(repeat, declarations("2m"), SOURCE, stamp=STAMP)

    assert stamped(repeat, SOURCE, "f1") is None
    assert any("not stamped" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    sync(repeat, declarations("2m"), SOURCE, stamp=STAMP)  # recreates job-0, stamps
    assert stamped(repeat, SOURCE, "f1") is not None
    assert len(repeat.list("reports")) == 3


def test_a_stamp_edited_or_deleted_by_hand_is_not_trusted(repeat: Repeat) -> None:
    sync(repeat, declarations(), SOURCE, stamp=STAMP)
    key = synced_key(repeat.prefix, SOURCE)
    broken = '{"fingerprint":"f1","queues":[],"summary":1}'
    deep = '{"fingerprint":"f1","queues":[7],"summary":{}}'
    nested = "[" * 100_000 + "]" * 100_000
    for edited in ["not json", '{"fingerprint": "f1"}', broken, deep, nested]:
        repeat.client.set(key, edited)
        assert stamped(repeat, SOURCE, "f1") is None
    sync(repeat, declarations(), SOURCE, stamp=STAMP)
    repeat.client.delete(repeat.keys("reports").synced)  # the counters gone
    assert stamped(repeat, SOURCE, "f1") is None
    sync(repeat, declarations(), SOURCE, stamp=STAMP)
    assert stamped(repeat, SOURCE, "f1") is not None
    repeat.client.delete(key)
    assert stamped(repeat, SOURCE, "f1") is None
    # A write counter edited by hand into a non-integer: no stamp holds, nothing fails, and
    # the next writes restart it.
    synced = repeat.keys("reports").synced
    repeat.client.hset(synced, "{w}" + SOURCE, "x")
    plan = sync(repeat, declarations("3m"), SOURCE, stamp=STAMP)
    assert len(plan.update) == 3 and stamped(repeat, SOURCE, "f1") is None
    repeat.client.hset(synced, "{w}" + SOURCE, "y")
    repeat.cancel("reports", "job-0")  # cancel restarts it as well
    assert repeat.client.hget(synced, "{w}" + SOURCE) == b"1"
    sync(repeat, declarations("3m"), SOURCE, stamp=STAMP)
    assert stamped(repeat, SOURCE, "f1") is not None


def test_a_stamp_needs_a_pruning_sync(repeat: Repeat) -> None:
    with pytest.raises(ValueError, match="prunes"):
        sync(repeat, declarations(), SOURCE, prune=False, stamp=STAMP)
    assert repeat.list("reports") == []


def test_a_refused_generation_is_not_stamped(repeat: Repeat) -> None:
    sync(repeat, declarations(), SOURCE, generation=2)
    plan = sync(repeat, declarations("2m"), SOURCE, generation=1, stamp=STAMP)
    assert plan.refused_by == 2
    assert stamped(repeat, SOURCE, "f1") is None


def test_a_sync_that_stamps_itself_reads_and_writes_nothing_the_second_time(
    repeat: Repeat,
) -> None:
    first = sync(repeat, declarations(), SOURCE, stamp=True)
    assert len(first.create) == 3 and not first.by_stamp
    before = writes(repeat), repeat.client.info("commandstats").get("cmdstat_evalsha", {})

    again = sync(repeat, list(reversed(declarations())), SOURCE, stamp=True)  # any order

    assert again.by_stamp and again.changes == 0
    assert sorted(d.name for d in again.unchanged) == ["job-0", "job-1", "job-2"]
    assert (writes(repeat), repeat.client.info("commandstats").get("cmdstat_evalsha", {})) == before
    repeat.cancel("reports", "job-1")  # another writer: read and synced in full again
    third = sync(repeat, declarations(), SOURCE, stamp=True)
    assert not third.by_stamp and [d.name for d in third.create] == ["job-1"]
    changed = sync(repeat, declarations("2m"), SOURCE, stamp=True)
    assert not changed.by_stamp and len(changed.update) == 3


def test_the_declarations_fingerprint_is_what_a_sync_compares() -> None:
    base = declarations_fingerprint(declarations(), SOURCE)
    assert base == declarations_fingerprint(list(reversed(declarations())), SOURCE)
    assert base != declarations_fingerprint(declarations("2m"), SOURCE)
    assert base != declarations_fingerprint(declarations()[:2], SOURCE)
    assert base != declarations_fingerprint(declarations(queue="other"), SOURCE)
    assert base != declarations_fingerprint(declarations(), "other")
    assert base != declarations_fingerprint(declarations(), SOURCE, generation=1)


@pytest.mark.parametrize("point", ["before the plan", "after the plan", "before the stamp"])
@pytest.mark.parametrize("other", ["cancel", "takeover", "create"])
def test_a_stamp_never_holds_over_a_registry_another_writer_changed_mid_sync(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch, point: str, other: str
) -> None:
    """Whatever another writer does to the source's records at whichever step of a stamped
    sync, the stamp is refused; the next sync puts the declarations back and stamps."""
    sync(repeat, declarations(), SOURCE)  # the registry as the declarations say
    wanted = {f"job-{i}": SOURCE for i in range(3)}
    done: list[bool] = []

    def interfere() -> None:
        if done:
            return
        done.append(True)
        if other == "cancel":
            repeat.cancel("reports", "job-1")
        elif other == "takeover":
            sync(repeat, declarations("9m")[:1], "intruder", prune=False)
        else:  # a record of the source that the declarations do not hold
            extra = Declaration("reports", "stray", define(every="1h", template={"task": "t"}))
            sync(repeat, [extra], SOURCE, prune=False)

    sync_module = importlib.import_module("emq_bridge.sync")
    if point == "before the plan":
        digests = repeat.digests
        monkeypatch.setattr(repeat, "digests", lambda q, **kw: (interfere(), digests(q, **kw))[1])
    elif point == "after the plan":
        old_records = sync_module._old_records
        monkeypatch.setattr(
            sync_module, "_old_records", lambda r, p: (interfere(), old_records(r, p))[1]
        )
    else:
        write_stamps = repeat.write_stamps
        monkeypatch.setattr(
            repeat, "write_stamps", lambda *a, **k: (interfere(), write_stamps(*a, **k))[1]
        )

    sync(repeat, declarations(), SOURCE, stamp=STAMP)
    monkeypatch.undo()

    # Every one of those writes is of the source's records: the stamp is refused, whatever
    # the sync itself wrote to converge.
    assert done and stamped(repeat, SOURCE, "f1") is None
    sync(repeat, declarations(), SOURCE, stamp=STAMP)  # the next boot: in full
    assert {r.name: r.source for r in repeat.list("reports")} == wanted
    assert stamped(repeat, SOURCE, "f1") is not None
