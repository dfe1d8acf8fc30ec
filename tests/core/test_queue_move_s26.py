"""A deploy that changes a declared schedule's queue (Celery `task_routes`, a Dramatiq
`queue_name`, a schedule file's `queue`) moves its registration as it is.

The sync plans it as a create in the new queue and a remove from the old one. Before, it
created the new record from the cadence alone, then cancelled the old one: a slot that came
due between the two was sent from both queues (two occurrence ids, so a consumer
deduplicating on ids ran it twice), and only a paused record's state went along: a `limit`
started again, a completed schedule ran again, an `immediately` fired again. Now the old
record is frozen first (paused by the move), the new one is seeded from it, then the old one
is cancelled; a sync that stopped after the freeze leaves a pause the next sync takes as the
move's own.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from emq_bridge import Pump, Repeat
from emq_bridge.definition import Declaration, Definition, define
from emq_bridge.registry import StaleGeneration
from emq_bridge.sync import sync
from emq_bridge.testing import ManualClock, RecordingDispatcher, manual_pump

SOURCE = "app"
OLD, NEW = "old", "new"
TEMPLATE = {"task": "t.run"}
# The move's own pause (`sync.MOVING_BY`), as a sync that died after its freeze left it.
MOVING_BY = "emq-bridge sync (moving queue)"


def declared(queue: str, definitions: dict[str, Definition]) -> list[Declaration]:
    return [Declaration(queue, name, d) for name, d in definitions.items()]


def stalled(method: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """`method`, each call held `seconds` first: a sync whose steps take that long."""

    def held(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return method(*args, **kwargs)

    return held


@pytest.fixture
def running(repeat: Repeat) -> Iterator[RecordingDispatcher]:
    """A pump on its own thread, on the server's clock, serving both queues throughout."""
    recorder = RecordingDispatcher()
    pump = Pump(repeat, [OLD, NEW], recorder, max_sleep_s=0.05)
    thread = threading.Thread(target=pump.run, daemon=True)
    thread.start()
    yield recorder
    pump.stop()
    thread.join(20)
    assert not thread.is_alive()


def wait_for(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_move_while_a_pump_runs_sends_no_slot_from_both_queues(
    repeat: Repeat, running: RecordingDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    every_second = define(every="1s", template=TEMPLATE)
    names = {f"s{i}": every_second for i in range(300)}
    sync(repeat, declared(OLD, names), SOURCE)
    wait_for(lambda: set(running.names()) == set(names))
    # Each pause and cancel held 4 ms: the move's steps span more than a slot (1 s), so a
    # slot comes due while some old records are still in place.
    monkeypatch.setattr(repeat, "pause", stalled(repeat.pause, 0.004))
    monkeypatch.setattr(repeat, "cancel", stalled(repeat.cancel, 0.004))

    plan = sync(repeat, declared(NEW, names), SOURCE)

    assert len(plan.create) == len(plan.remove) == len(names)
    assert repeat.list(OLD) == []

    def moved_on() -> bool:
        fired = Counter(o.name for o in list(running.occurrences) if o.queue == NEW)
        return len(fired) == len(names) and min(fired.values()) >= 2

    wait_for(moved_on)
    sent = Counter((o.name, o.due_ms) for o in list(running.occurrences))
    twice = [(slot, n) for slot, n in sent.items() if n > 1]
    assert twice == [], f"{len(twice)} slots sent twice, e.g. {twice[:3]}"


def test_a_move_keeps_the_runs_left_the_completion_and_the_first_run_done(
    repeat: Repeat,
) -> None:
    v1 = {
        "limited": define(every="1s", limit=2, template=TEMPLATE),
        "finished": define(every="1s", limit=1, template=TEMPLATE),
        "at_once": define(every="1h", immediately=True, template=TEMPLATE),
        "at_once_edited": define(every="1h", immediately=True, template=TEMPLATE),
    }
    sync(repeat, declared(OLD, v1), SOURCE)
    clock = ManualClock(repeat.server_time_ms())
    recorder = RecordingDispatcher()
    pump = manual_pump(repeat, [OLD, NEW], clock, recorder)
    while set(recorder.names()) != set(v1):  # one run each: the first slot, the immediate one
        clock.advance(500)
        pump.run_once()
    assert sorted(recorder.names()) == sorted(v1)
    before = {name: repeat.read(OLD, name) for name in v1}
    assert before["limited"].remaining == 1 and before["finished"].completed == "limit"

    v2 = {**v1, "at_once_edited": define(every="2h", immediately=True, template=TEMPLATE)}
    plan = sync(repeat, declared(NEW, v2), SOURCE)

    assert len(plan.create) == len(plan.remove) == len(v1)
    after = {name: repeat.read(NEW, name) for name in v1}
    for name in v1:  # the counters go along
        assert after[name].fired == before[name].fired == 1
        assert after[name].last_fired_ms == before[name].last_fired_ms is not None
        assert after[name].last_due_ms == before[name].last_due_ms
        assert not after[name].paused
    assert after["limited"].remaining == 1 and after["limited"].completed is None
    assert after["limited"].next_run_ms == before["limited"].next_run_ms
    assert after["finished"].completed == "limit"
    assert after["finished"].completed_ms == before["finished"].completed_ms
    assert after["at_once"].next_run_ms == before["at_once"].next_run_ms  # the hour's slot
    moved_at = clock.now_ms
    for _ in range(10):
        clock.advance(1000)
        pump.run_once()

    runs = Counter(recorder.names())
    assert runs["limited"] == 2  # one more, the one left
    assert runs["finished"] == 1  # completed: none
    assert repeat.read(NEW, "limited").completed == "limit"
    assert repeat.read(NEW, "finished").completed == "limit"
    for name in ("at_once", "at_once_edited"):  # no second immediate run
        again = [o.due_ms for o in recorder.occurrences if o.name == name and o.queue == NEW]
        assert all(due > moved_at + 10_000 for due in again), (name, again)


def test_a_schedule_paused_by_someone_moves_paused_with_its_note(repeat: Repeat) -> None:
    definitions = {"held": define(every="1s", template=TEMPLATE)}
    sync(repeat, declared(OLD, definitions), SOURCE)
    assert repeat.pause(OLD, "held", note="until the fix ships", by="ops")
    before = repeat.read(OLD, "held")

    sync(repeat, declared(NEW, definitions), SOURCE)

    after = repeat.read(NEW, "held")
    assert after.paused and after.next_run_ms == before.next_run_ms
    assert (after.paused_note, after.paused_by, after.paused_ms) == (
        "until the fix ships",
        "ops",
        before.paused_ms,
    )
    clock = ManualClock(repeat.server_time_ms())
    pump = manual_pump(repeat, [OLD, NEW], clock)
    for _ in range(3):
        clock.advance(1000)
        pump.run_once()
    assert isinstance(pump.dispatcher, RecordingDispatcher)
    assert pump.dispatcher.names() == []


def test_the_sync_after_one_that_stopped_after_its_freeze_carries_the_next_run_not_the_pause(
    repeat: Repeat,
) -> None:
    definitions = {"job": define(every="1s", template=TEMPLATE)}
    sync(repeat, declared(OLD, definitions), SOURCE)
    clock = ManualClock(repeat.server_time_ms())
    recorder = RecordingDispatcher()
    pump = manual_pump(repeat, [OLD, NEW], clock, recorder)
    while not recorder.names():
        clock.advance(500)
        pump.run_once()
    # What a sync that died between its freeze and its cancel left: the old record paused
    # by the move, no new one.
    repeat.pause(OLD, "job", note=f"moving to queue {NEW}", by=MOVING_BY)
    frozen = repeat.read(OLD, "job")

    plan = sync(repeat, declared(NEW, definitions), SOURCE)

    assert plan.remove == [(OLD, "job")] and [d.name for d in plan.create] == ["job"]
    assert repeat.get(OLD, "job") is None
    moved = repeat.read(NEW, "job")
    assert not moved.paused and moved.paused_by is None and moved.paused_note is None
    assert moved.next_run_ms == frozen.next_run_ms
    assert moved.fired == frozen.fired == 1
    sync_module = importlib.import_module("emq_bridge.sync")  # (`emq_bridge.sync` is the function)
    assert getattr(sync_module, "MOVING_BY", None) == MOVING_BY


def test_a_move_a_newer_generation_refuses_leaves_the_old_record_firing(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    definitions = {"job": define(every="1s", template=TEMPLATE)}
    sync(repeat, declared(OLD, definitions), SOURCE, generation=1)
    before = repeat.read(OLD, "job")
    upsert = repeat.upsert_declared

    def newer_first(declarations: list[Declaration], **options: Any) -> Any:
        if declarations:  # a newer deploy's sync reached the new queue first
            upsert([], source=SOURCE, generation=2, queues=[NEW])
        return upsert(declarations, **options)

    monkeypatch.setattr(repeat, "upsert_declared", newer_first)

    plan = sync(repeat, declared(NEW, definitions), SOURCE, generation=1)

    assert plan.refused_by == 2
    assert repeat.get(NEW, "job") is None
    after = repeat.read(OLD, "job")
    assert not after.paused and after.next_run_ms == before.next_run_ms
    with pytest.raises(StaleGeneration):  # the newer generation holds the new queue
        upsert(declared(NEW, definitions), source=SOURCE, generation=1)
