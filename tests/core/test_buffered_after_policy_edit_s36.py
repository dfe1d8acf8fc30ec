"""A slot `buffer_one` held when an edit makes the policy `allow` or `replace` is dropped and
counted, not left waiting (found by a probe of lifecycle edits with real workers, session 36).

Under `allow` every slot is sent, the runs overlap, and the end the held slot waited for may
never come: it stayed `buffered` for good (then ran 23 s late once the policy went back to
`skip`). Under `replace` a leftover held slot made the claim skip the slot that should have
replaced the run. The claim now drops it, counted in `missed` (as a pause drops it); a
`skip` edit keeps it, released when the run ends. A real server, a pump, a manual clock.
"""

from __future__ import annotations

import pytest
import redis

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

T0 = 1_900_000_000_000


def held(client: redis.Redis, prefix: str) -> tuple[Repeat, ManualClock, Pump, RecordingDispatcher]:
    """A `buffer_one` schedule whose first occurrence runs (started) and whose next slot is
    held."""
    clock = ManualClock(T0)
    repeat = Repeat(client, prefix, clock=clock)
    repeat.register("q", "job", every="1s", overlap="buffer_one", template={"task": "t"})
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)
    clock.advance(1_000)
    pump.run_once()
    [first] = dispatcher.occurrences
    running: Occurrence = first
    assert repeat.begin(running) and repeat.started(running)
    clock.advance(1_000)
    pump.run_once()
    job = repeat.get("q", "job")
    assert job is not None and job.buffered_due_ms == T0 + 2_000
    return repeat, clock, pump, dispatcher


@pytest.mark.parametrize("policy", ["allow", "replace"])
def test_an_edit_to_allow_or_replace_drops_the_held_slot_counted(
    client: redis.Redis, prefix: str, policy: str
) -> None:
    repeat, clock, pump, dispatcher = held(client, prefix)
    repeat.upsert("q", "job", every="1s", overlap=policy, template={"task": "t"})
    clock.advance(1_000)
    pump.run_once()
    job = repeat.get("q", "job")
    assert job is not None and job.buffered_due_ms is None and job.missed == 1
    sent = [o.due_ms for o in dispatcher.occurrences]
    assert sent == [T0 + 1_000, T0 + 3_000]  # the slot of the edit's policy went out
    statuses = {e.due_ms: e.status for e in repeat.history("q", "job")}
    assert statuses.get(T0 + 3_000) != "skipped", statuses


def test_an_edit_to_skip_keeps_the_held_slot(client: redis.Redis, prefix: str) -> None:
    repeat, clock, pump, _ = held(client, prefix)
    repeat.upsert("q", "job", every="1s", overlap="skip", template={"task": "t"})
    clock.advance(1_000)
    pump.run_once()
    job = repeat.get("q", "job")
    assert job is not None and job.buffered_due_ms == T0 + 2_000 and job.missed == 0


def test_a_dropped_held_slot_gives_back_its_run_of_a_limit(
    client: redis.Redis, prefix: str
) -> None:
    # The second review of session 36: held, the slot took one of `limit`'s runs; dropped,
    # it gave none back, so the edit cost the schedule a run.
    clock = ManualClock(T0)
    repeat = Repeat(client, prefix, clock=clock)
    repeat.register("q", "job", every="1s", overlap="buffer_one", limit=3, template={"task": "t"})
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)
    clock.advance(1_000)
    pump.run_once()
    [running] = dispatcher.occurrences
    assert repeat.begin(running) and repeat.started(running)
    clock.advance(1_000)
    pump.run_once()  # 2000 held: one run of the three taken
    repeat.upsert("q", "job", every="1s", overlap="allow", limit=3, template={"task": "t"})
    for _ in range(3):
        clock.advance(1_000)
        pump.run_once()
    assert [o.due_ms for o in dispatcher.occurrences] == [T0 + 1_000, T0 + 3_000, T0 + 4_000]
    job = repeat.get("q", "job")
    assert job is not None and job.completed == "limit" and job.fired == 3
