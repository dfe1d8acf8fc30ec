"""A property test: the registry moves and the pump, held against a plain-Python model.

Dispatches may fail, so leases expire and are re-sent; triggers are sent once, and re-sent as
redelivered only after their lease expired.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from registry_state import drop_prefix

from emq_bridge import Occurrence, Pump, Repeat, occurrence_id
from emq_bridge.errors import DispatchError

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
LEASE_MS = 60_000
NAMES = st.sampled_from(["a", "b", "c", "d"])
EVERY = st.sampled_from([1_000, 5_000, 60_000])
TASKS = st.sampled_from(["t1", "t2"])


def on_grid(now: int, every: int) -> int:
    """The first slot of the epoch grid of `every` after `now` (an interval's default)."""
    return (now // every + 1) * every


@dataclass
class Model:
    every_ms: int
    task: str
    next_ms: int
    paused: bool = False
    last_due: int | None = None  # the last slot fired


# What the model says a tick sends: (name, due_ms, task, triggered, redelivered).
Sent = tuple[str, int, str, bool, bool]
# An occurrence in flight: (name, due_ms, triggered), as its lease names it.
InFlight = tuple[str, int, bool]


class FlakyDispatcher:
    """Records every occurrence handed to it; fails them all while `failing` is set."""

    def __init__(self) -> None:
        self.occurrences: list[Occurrence] = []
        self.failing = False

    def dispatch(self, occurrence: Occurrence) -> None:
        self.occurrences.append(occurrence)
        if self.failing:
            raise DispatchError("the broker is down")


def test_registry_moves_match_a_plain_python_model(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    class RegistryMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.repeat = Repeat(client, f"m{uuid.uuid4().hex[:10]}")
            self.now = T0
            self.model: dict[str, Model] = {}
            # Triggers no pump has claimed, and the leases of occurrences sent but not acked
            # (a failed dispatch), with their deadlines.
            self.pending: set[tuple[str, int]] = set()
            self.in_flight: dict[InFlight, int] = {}
            # Each registration's last trigger instant: a trigger is an occurrence of its
            # own, at now or a ms after the last one (session 26).
            self.last_trigger: dict[str, int] = {}
            self.dispatcher = FlakyDispatcher()
            self.pump = Pump(self.repeat, ["q"], self.dispatcher, lease_ms=LEASE_MS)

        def teardown(self) -> None:
            drop_prefix(client, self.repeat.prefix)  # each example has a prefix of its own

        @rule(name=NAMES, every=EVERY, task=TASKS)
        def register(self, name: str, every: int, task: str) -> None:
            result = self.repeat.register(
                "q", name, every_ms=every, template={"task": task}, now_ms=self.now
            )
            if name in self.model:
                assert result == "exists"
            else:
                assert result == "registered"
                self.model[name] = Model(every, task, on_grid(self.now, every))

        @rule(name=NAMES, every=EVERY, task=TASKS)
        def upsert(self, name: str, every: int, task: str) -> None:
            result = self.repeat.upsert(
                "q", name, every_ms=every, template={"task": task}, now_ms=self.now
            )
            current = self.model.get(name)
            if current is None:
                assert result == "created"
                self.model[name] = Model(every, task, on_grid(self.now, every))
            elif (current.every_ms, current.task) == (every, task):
                assert result == "unchanged"
            else:
                assert result == "updated"
                if current.every_ms != every:
                    current.next_ms = on_grid(self.now, every)  # the new grid, not now
                current.every_ms, current.task = every, task

        @rule(name=NAMES)
        def cancel(self, name: str) -> None:
            assert self.repeat.cancel("q", name) == (name in self.model)
            self.model.pop(name, None)
            self.last_trigger.pop(name, None)
            self.pending = {p for p in self.pending if p[0] != name}
            self.in_flight = {k: d for k, d in self.in_flight.items() if k[0] != name}

        @rule(name=NAMES)
        def pause(self, name: str) -> None:
            current = self.model.get(name)
            if current is None:
                with pytest.raises(KeyError):
                    self.repeat.pause("q", name)
                return
            assert self.repeat.pause("q", name) == (not current.paused)
            current.paused = True

        @rule(name=NAMES)
        def resume(self, name: str) -> None:
            current = self.model.get(name)
            if current is None:
                with pytest.raises(KeyError):
                    self.repeat.resume("q", name, now_ms=self.now)
                return
            assert self.repeat.resume("q", name, now_ms=self.now) == current.paused
            if current.paused:
                current.paused = False
                while current.next_ms <= self.now:
                    current.next_ms += current.every_ms

        @rule(name=NAMES)
        def trigger(self, name: str) -> None:
            if name not in self.model:
                with pytest.raises(KeyError):
                    self.repeat.trigger("q", name, now_ms=self.now)
                return
            at = max(self.now, self.last_trigger.get(name, self.now - 1) + 1)
            self.last_trigger[name] = at
            expected = occurrence_id(self.repeat.prefix, "q", name, at, triggered=True)
            assert self.repeat.trigger("q", name, now_ms=self.now) == expected
            self.pending.add((name, at))

        @rule(step=st.integers(0, 130_000), failing=st.booleans())
        def tick(self, step: int, failing: bool) -> None:
            self.now += step
            self.dispatcher.occurrences.clear()
            self.dispatcher.failing = failing
            self.pump.run_once(now_ms=self.now)
            expected: dict[InFlight, Sent] = {}
            for name, current in self.model.items():
                if not current.paused and current.next_ms <= self.now:
                    # The default misfire policy (`latest`): the newest passed slot fires.
                    late = (self.now - current.next_ms) // current.every_ms
                    newest = current.next_ms + late * current.every_ms
                    expected[(name, newest, False)] = (name, newest, current.task, False, False)
                    current.last_due = newest
                    current.next_ms = newest + current.every_ms
            # An expired lease is re-sent, paused or not; a pending trigger is sent unless
            # its occurrence is in flight already (its lease then carries it).
            for (name, due, triggered), deadline in self.in_flight.items():
                if deadline <= self.now:
                    task = self.model[name].task
                    expected[(name, due, triggered)] = (name, due, task, triggered, True)
            for name, due in self.pending:
                if (name, due, True) not in self.in_flight:
                    expected[(name, due, True)] = (name, due, self.model[name].task, True, False)
            self.pending.clear()
            for key in expected:
                if failing:
                    self.in_flight[key] = self.now + LEASE_MS
                else:
                    self.in_flight.pop(key, None)
            sent = [
                (o.name, o.due_ms, o.template["task"], o.triggered, o.redelivered)
                for o in self.dispatcher.occurrences
            ]
            assert sorted(sent) == sorted(expected.values())
            for o in self.dispatcher.occurrences:
                assert o.id == occurrence_id(
                    self.repeat.prefix, "q", o.name, o.due_ms, triggered=o.triggered
                )

        @invariant()
        def registry_matches_model(self) -> None:
            keys = self.repeat.keys("q")
            scores = {
                m.decode(): s for m, s in client.zrange(keys.registry, 0, -1, withscores=True)
            }
            assert set(scores) == set(self.model)
            for name, current in self.model.items():
                assert scores[name] == (float("inf") if current.paused else current.next_ms)
                record = client.hgetall(keys.record(name))
                assert record[b"every_ms"] == str(current.every_ms).encode()
                # A score never moves to a slot at or before the last fired one, nor does
                # a paused registration's parked next run (docs/design.md).
                last = record.get(b"last_due_ms")
                assert (int(last) if last else None) == current.last_due
                if last:
                    parked = record.get(b"paused_next_ms")
                    next_ms = float(parked) if current.paused and parked else scores[name]
                    assert next_ms > int(last), f"{name}: next run {next_ms}, fired {last}"
            leases = [(n, t, 0) for n, t in self.pending]
            leases += [(n, t, deadline) for (n, t, _), deadline in self.in_flight.items()]
            assert sorted(self.repeat.leases("q")) == sorted(leases)

    run_state_machine_as_test(
        RegistryMachine, settings=settings(max_examples=200, stateful_step_count=30, deadline=None)
    )
