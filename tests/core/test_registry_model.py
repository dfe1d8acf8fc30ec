"""A property test: the registry moves and the pump, held against a plain-Python model."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000
NAMES = st.sampled_from(["a", "b", "c", "d"])
EVERY = st.sampled_from([1_000, 5_000, 60_000])
TASKS = st.sampled_from(["t1", "t2"])


@dataclass
class Model:
    every_ms: int
    task: str
    next_ms: int
    paused: bool = False


def test_registry_moves_match_a_plain_python_model(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    class RegistryMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.repeat = Repeat(client, f"m{uuid.uuid4().hex[:10]}")
            self.now = T0
            self.model: dict[str, Model] = {}
            self.recorder = RecordingDispatcher()
            self.pump = Pump(self.repeat, ["q"], self.recorder)

        @rule(name=NAMES, every=EVERY, task=TASKS)
        def register(self, name: str, every: int, task: str) -> None:
            result = self.repeat.register(
                "q", name, every_ms=every, template={"task": task}, now_ms=self.now
            )
            if name in self.model:
                assert result == "exists"
            else:
                assert result == "registered"
                self.model[name] = Model(every, task, self.now + every)

        @rule(name=NAMES, every=EVERY, task=TASKS)
        def upsert(self, name: str, every: int, task: str) -> None:
            result = self.repeat.upsert(
                "q", name, every_ms=every, template={"task": task}, now_ms=self.now
            )
            current = self.model.get(name)
            if current is None:
                assert result == "created"
                self.model[name] = Model(every, task, self.now + every)
            elif (current.every_ms, current.task) == (every, task):
                assert result == "unchanged"
            else:
                assert result == "updated"
                if current.every_ms != every:
                    current.next_ms = self.now + every
                current.every_ms, current.task = every, task

        @rule(name=NAMES)
        def cancel(self, name: str) -> None:
            assert self.repeat.cancel("q", name) == (name in self.model)
            self.model.pop(name, None)

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

        @rule(step=st.integers(0, 130_000))
        def tick(self, step: int) -> None:
            self.now += step
            self.recorder.clear()
            self.pump.run_once(now_ms=self.now)
            expected = []
            for name, current in self.model.items():
                if not current.paused and current.next_ms <= self.now:
                    expected.append((name, current.next_ms, current.task))
                    while current.next_ms <= self.now:  # coalesce
                        current.next_ms += current.every_ms
            fired = [(o.name, o.due_ms, o.template["task"]) for o in self.recorder.occurrences]
            assert sorted(fired) == sorted(expected)

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
            assert self.repeat.leases("q") == []

    run_state_machine_as_test(
        RegistryMachine, settings=settings(max_examples=200, stateful_step_count=30, deadline=None)
    )
