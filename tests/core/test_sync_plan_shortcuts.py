"""The plan's shortcuts (distinct names checked as a set, an empty registry planned as all
creates, pruning only where the source owns something) decide as the full comparison does."""

from __future__ import annotations

import pytest

from emq_bridge import Repeat
from emq_bridge.definition import Declaration, define
from emq_bridge.errors import ConfigError
from emq_bridge.sync import plan_sync, sync


def declared(queue: str, name: str, every: int = 60) -> Declaration:
    return Declaration(queue, name, define(every=every, template={"task": "t", "args": [name]}))


def test_a_name_declared_twice_in_one_queue_is_refused_before_any_write(repeat: Repeat) -> None:
    twice = [declared("q1", "a"), declared("q2", "b"), declared("q1", "a", every=30)]

    with pytest.raises(ConfigError, match="schedule q1/a is declared twice"):
        sync(repeat, twice, "src")
    assert repeat.list("q1") == [] and repeat.list("q2") == []


def test_one_name_in_two_queues_is_two_schedules(repeat: Repeat) -> None:
    plan = sync(repeat, [declared("q1", "a"), declared("q2", "a")], "src")

    assert sorted((d.queue, d.name) for d in plan.create) == [("q1", "a"), ("q2", "a")]


def test_a_registry_that_holds_some_of_them_is_compared_one_by_one(repeat: Repeat) -> None:
    sync(repeat, [declared("q", "kept"), declared("q", "edited"), declared("q", "gone")], "src")
    repeat.upsert("q", "theirs", every=60, template={"task": "t"}, source="other")

    plan = plan_sync(
        repeat,
        [declared("q", "kept"), declared("q", "edited", every=30), declared("q", "new")],
        "src",
    )

    assert [d.name for d in plan.unchanged] == ["kept"]
    assert [d.name for d in plan.update] == ["edited"]
    assert [d.name for d in plan.create] == ["new"]
    assert plan.remove == [("q", "gone")]  # never another source's
