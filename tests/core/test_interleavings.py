"""Interleavings: every move that reads before it writes, stalled between the two.

A move that computes in Python from what it read writes from those values, however stale
they are by then: a resume's next run (from the record it read), a sync's plan (from the
digests it read, and the clock it read) and a pump's candidates (from its scan and records).
Each is split in two rules. The "read" rule runs the real move (`Repeat.resume`, `Pump`) on
its own thread up to its write and holds it there, or plans the sync; the "write" rule, any
later step, lets it go. Other moves and pumps run in between, the injected clock moves, and a
pump may die after its claim, before its ack.

After every step: one registry member per record and none without one; no key under the
prefix but the registry, its records, the leases and the other keys `QueueKeys` documents; no
score, nor a paused registration's parked next run, at or before the last fired slot; no
occurrence sent twice, unless its pump died before the ack, and then with the same id and
`redelivered=True`. (docs/design.md, "Moves" and "Leases"; DESIGN.md: a score never moves to
a slot at or before the last fired one.)

A race needs a few moves in a row, so the search runs many examples (derandomized, for CI);
the races it found are also replayed step by step at the end, whatever the search draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from emq_bridge import Occurrence, Pump, Repeat, occurrence_id
from emq_bridge.definition import Declaration, Definition, define
from emq_bridge.errors import DispatchError
from emq_bridge.keys import QueueKeys
from emq_bridge.registry import Claim
from emq_bridge.sync import SyncPlan, plan_sync

T0 = 1_900_000_000_000
LEASE_MS = 10_000
Q = "q"
SOURCE = "app"
MAX_PENDING = 3
NAME_LIST = ("a", "b")
NAMES = st.sampled_from(NAME_LIST)
EVERY_SECOND = define(every_ms=1_000, template={"task": "t1"})
EVERY_3S = define(every_ms=3_000, template={"task": "t1"})
# Shrinks towards the first: short intervals fire most.
DEFINITIONS = st.sampled_from(
    [
        EVERY_SECOND,
        define(every_ms=1_000, template={"task": "t2"}),
        EVERY_3S,
        define(every_ms=3_000, misfire="catchup", template={"task": "t1"}),
        define(every_ms=7_000, anchor="release", template={"task": "t1"}),
        define(cron="* * * * *", template={"task": "t1"}),
    ]
)
# How far the clock moves before a pump tick, ms: not at all, within a slot, a slot, past a
# lease, past a cron minute.
WAITS_MS = st.sampled_from([1_000, 0, 999, 3_000, LEASE_MS + 1, 61_000])
Mode = Literal["accept", "refuse", "die_before_send", "die_before_ack"]
MODES: st.SearchStrategy[Mode] = st.sampled_from(
    ["accept", "refuse", "die_before_send", "die_before_ack"]
)


def queue_keys(keys: QueueKeys) -> set[str]:
    """The keys of a queue besides its records: the registry, the leases, and whichever
    others `QueueKeys` documents (a property each; the wake channel is no key)."""
    names = [n for n, v in vars(QueueKeys).items() if isinstance(v, property)]
    return {getattr(keys, n) for n in names} - {keys.tag, keys.wake_channel}


class PumpDied(BaseException):
    """A pump process dying: no `Exception`, so nothing in the pump catches it."""


class Abandoned(BaseException):
    """A stalled move never let go (the example ended): its thread unwinds."""


class Gate:
    """Holds the first call through it until `open`: the stall between a read and its write."""

    def __init__(self) -> None:
        self.stopped = threading.Event()  # held here, or the move ended without writing
        self._go = threading.Event()
        self._abandoned = False
        self._used = False

    def hold(self) -> None:
        if self._used:
            return
        self._used = True
        self.stopped.set()
        self._go.wait()
        if self._abandoned:
            raise Abandoned

    @property
    def held(self) -> bool:
        return self._used

    def open(self, *, abandon: bool = False) -> None:
        self._abandoned = abandon
        self._go.set()


class StalledRepeat(Repeat):
    """The `Repeat` of one stalled move: its first resume script or claim waits at `gate`.

    With `dies_at_ack`, its pump dies when it acks (after it sent its batch).
    """

    def __init__(self, client: Any, prefix: str, gate: Gate, *, dies_at_ack: bool) -> None:
        super().__init__(client, prefix)
        self.gate = gate
        self.dies_at_ack = dies_at_ack
        resume = self.scripts.resume

        def held_resume(*args: Any, **kwargs: Any) -> Any:
            gate.hold()
            return resume(*args, **kwargs)

        self.scripts = dataclasses.replace(self.scripts, resume=held_resume)

    def claim(self, *args: Any, **kwargs: Any) -> Claim:
        self.gate.hold()
        return super().claim(*args, **kwargs)

    def ack(self, *args: Any, **kwargs: Any) -> int | None:
        if self.dies_at_ack:
            raise PumpDied
        return super().ack(*args, **kwargs)


class Broker:
    """The broker of one pump step: it accepts, refuses (the lease stays), or the pump dies."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.accepted: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        if self.mode == "die_before_send":
            raise PumpDied
        if self.mode == "refuse":
            raise DispatchError("the broker is down")
        self.accepted.append(occurrence)


@dataclasses.dataclass
class Stalled:
    """A move on its own thread, held at its write."""

    label: str
    gate: Gate
    thread: threading.Thread
    outcome: list[BaseException]  # what the thread raised, if anything
    broker: Broker | None = None  # a pump's


@dataclasses.dataclass
class PlannedSync:
    """A sync planned from the digests it read, with the clock it read."""

    label: str
    plan: SyncPlan
    now_ms: int


def stall(label: str, gate: Gate, move: Callable[[], object]) -> Stalled | None:
    """Run `move` on a thread up to `gate`; None if it ended without reaching its write."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            move()
        except BaseException as exc:  # re-raised on the test's thread, or expected
            outcome.append(exc)
        finally:
            gate.stopped.set()

    thread = threading.Thread(target=run, name=label, daemon=True)
    thread.start()
    assert gate.stopped.wait(30), f"{label} neither wrote nor ended"
    if not gate.held:
        thread.join(30)
        for exc in outcome:
            if not isinstance(exc, KeyError):  # the registration is gone: a fine answer
                raise exc
        return None
    return Stalled(label, gate, thread, outcome)


class Interleavings(RuleBasedStateMachine):
    """The registry's moves, and pumps, with some stalled between their read and their write.

    A test binds `client` and `base_prefix` in a subclass; each example gets its own prefix.
    """

    client: ClassVar[redis.Redis]
    base_prefix: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"{self.base_prefix}-{uuid.uuid4().hex[:8]}"
        self.repeat = Repeat(self.client, self.prefix)
        self.keys = self.repeat.keys(Q)
        self.now = T0
        self.pending: list[Stalled | PlannedSync] = []
        # Per occurrence (name, due_ms, triggered) sent: whether its pump acked it.
        self.sent: dict[tuple[str, int, bool], bool] = {}

    # -- moves that write what they read, in one script ---------------------------------

    @initialize(
        definitions=st.lists(DEFINITIONS, min_size=2, max_size=2),
        paused=st.lists(st.booleans(), min_size=2, max_size=2),
    )
    def register_all(self, definitions: list[Definition], paused: list[bool]) -> None:
        for name, definition, pause in zip(NAME_LIST, definitions, paused, strict=True):
            self.register(name, definition)
            if pause:
                self.pause(name)

    @rule(name=NAMES, definition=DEFINITIONS)
    def register(self, name: str, definition: Definition) -> None:
        self.repeat.register(Q, name, definition=definition, now_ms=self.now)

    @rule(name=NAMES)
    def cancel(self, name: str) -> None:
        if self.repeat.cancel(Q, name):
            self.forget(name)

    def forget(self, name: str) -> None:
        """A cancel ends a registration: one registered later under its name is fresh
        (docs/design.md), and its slots are its own, even where they fall on old ones."""
        self.sent = {key: acked for key, acked in self.sent.items() if key[0] != name}

    @rule(name=NAMES)
    def pause(self, name: str) -> None:
        with contextlib.suppress(KeyError):
            self.repeat.pause(Q, name)

    @rule(name=NAMES)
    def resume(self, name: str) -> None:
        with contextlib.suppress(KeyError):
            self.repeat.resume(Q, name, now_ms=self.now)

    @rule(wait_ms=WAITS_MS)
    def pump(self, wait_ms: int) -> None:
        self.now += wait_ms
        step = self.start_pump("accept")
        if step is not None:
            self.finish(step)

    @rule(name=NAMES)
    def trigger(self, name: str) -> None:
        with contextlib.suppress(KeyError):
            self.repeat.trigger(Q, name, now_ms=self.now)
        # Two triggers in one ms are one occurrence (one id): let each take its own.
        self.now += 1

    # -- moves split into a read and a write --------------------------------------------

    @precondition(lambda self: len(self.pending) < MAX_PENDING)
    @rule(name=NAMES)
    def resume_read(self, name: str) -> None:
        gate = Gate()
        stalled = StalledRepeat(self.client, self.prefix, gate, dies_at_ack=False)
        label = f"resume {name} read at {self.now - T0}"
        now = self.now
        held = stall(label, gate, lambda: stalled.resume(Q, name, now_ms=now))
        if held is not None:
            self.pending.append(held)

    @precondition(lambda self: len(self.pending) < MAX_PENDING)
    @rule(wait_ms=WAITS_MS, mode=MODES)
    def pump_read(self, wait_ms: int, mode: Mode) -> None:
        self.now += wait_ms
        step = self.start_pump(mode)
        if step is not None:
            self.pending.append(step)

    def start_pump(self, mode: Mode) -> Stalled | None:
        """Run a pump tick up to its claim (None if nothing was due)."""
        gate = Gate()
        stalled = StalledRepeat(
            self.client, self.prefix, gate, dies_at_ack=mode == "die_before_ack"
        )
        broker = Broker(mode)
        pump = Pump(stalled, [Q], broker, lease_ms=LEASE_MS)
        now = self.now
        held = stall(f"pump read at {now - T0}", gate, lambda: pump.run_once(now_ms=now))
        if held is not None:
            held.broker = broker
        return held

    @precondition(lambda self: len(self.pending) < MAX_PENDING)
    @rule(wanted=st.dictionaries(NAMES, DEFINITIONS, max_size=3))
    def sync_read(self, wanted: dict[str, Definition]) -> None:
        declarations = [Declaration(Q, name, d) for name, d in sorted(wanted.items())]
        plan = plan_sync(self.repeat, declarations, SOURCE, prune=True)
        self.pending.append(PlannedSync(f"sync read at {self.now - T0}", plan, self.now))

    @precondition(lambda self: bool(self.pending))
    @rule(index=st.integers(0, MAX_PENDING - 1))
    def write(self, index: int) -> None:
        step = self.pending.pop(index % len(self.pending))
        if isinstance(step, PlannedSync):
            # sync.sync's apply, with the clock the plan read.
            todo = [*step.plan.create, *step.plan.update]
            self.repeat.upsert_many(
                [(d.queue, d.name, d.definition) for d in todo],
                source=SOURCE,
                now_ms=step.now_ms,
            )
            for queue, name in step.plan.remove:
                if self.repeat.cancel(queue, name, if_source=SOURCE):
                    self.forget(name)
            return
        self.finish(step)

    def finish(self, step: Stalled) -> None:
        """Let a stalled move write, and wait for it to end."""
        step.gate.open()
        step.thread.join(30)
        assert not step.thread.is_alive(), f"{step.label} did not finish"
        died = False
        for exc in step.outcome:
            if isinstance(exc, PumpDied):
                died = True
            elif not isinstance(exc, KeyError):
                raise exc
        if step.broker is not None:
            self.record_sends(step.broker.accepted, acked=not died)

    def record_sends(self, accepted: list[Occurrence], *, acked: bool) -> None:
        for o in accepted:
            expected_id = occurrence_id(self.prefix, Q, o.name, o.due_ms, triggered=o.triggered)
            assert o.id == expected_id
            key = (o.name, o.due_ms, o.triggered)
            if key in self.sent:
                assert not self.sent[key], f"{key} sent twice: its first send was acked"
                assert o.redelivered, f"{key} sent again without redelivered=True"
            self.sent[key] = acked

    # -- after every step ---------------------------------------------------------------

    @invariant()
    def keys_follow_the_rules(self) -> None:
        """Read the queue's keys in one round trip, and hold them to the rules."""
        pipe = self.client.pipeline(transaction=False)
        pipe.keys(f"{self.prefix}:*")  # a fresh prefix: only this example's keys
        pipe.zrange(self.keys.registry, 0, -1, withscores=True)
        pipe.zrange(self.keys.leases, 0, -1)
        for name in NAME_LIST:
            pipe.hmget(self.keys.record(name), "last_due_ms", "paused", "paused_next_ms")
        found, scores, leases, *fields = pipe.execute()
        members = dict(scores)
        # One member per record, no member without one, and no key but the documented ones.
        records = {k for k in found if k.startswith(self.keys.record(""))}
        assert {k[len(self.keys.record("")) :] for k in records} == set(members)
        assert set(found) - records <= queue_keys(self.keys), "a key no move documents"
        for lease in leases:
            assert lease.split(" ")[0] in members, f"lease {lease!r} of no registration"
        # No score, nor a paused one's parked next run, at or before the last fired slot.
        for name, (last, paused, parked) in zip(NAME_LIST, fields, strict=True):
            if name not in members or last is None:
                continue
            score = members[name]
            if paused == "1":
                assert score == float("inf")
                if parked:
                    assert float(parked) > int(last), f"{name} parked at {parked}, fired {last}"
            else:
                assert score > int(last), f"{name} at {score}, last fired {last}"

    def teardown(self) -> None:
        for step in self.pending:
            if isinstance(step, Stalled):
                step.gate.open(abandon=True)
                step.thread.join(30)
        leftover = self.client.keys(f"{self.prefix}:*")
        if leftover:
            self.client.delete(*leftover)


@pytest.fixture
def on_server(redis_url: str, prefix: str) -> Iterator[type[Interleavings]]:
    """`Interleavings` bound to the real server and this test's prefix."""
    connection = redis.Redis.from_url(redis_url, decode_responses=True)

    class OnServer(Interleavings):
        client = connection
        base_prefix = prefix

    yield OnServer
    connection.close()


# 800 examples on a real server: about 110 s alone on a slow 2-vCPU VM, more beside the
# suite's other process (the default 300 s is for a test that hangs, which this one does
# not). It ran 1,200 until session 32, when the whole CI run neared its 20 minutes.
@pytest.mark.timeout(900)
def test_moves_stalled_between_their_read_and_their_write_keep_the_registry_whole(
    on_server: type[Interleavings],
) -> None:
    run_state_machine_as_test(
        on_server,
        settings=settings(
            max_examples=800,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            database=None,
        ),
    )


def replay(machine: Interleavings, *steps: Callable[[], object]) -> None:
    """Run `steps` one by one, checking the invariant after each, then tear down."""
    try:
        machine.keys_follow_the_rules()
        for step in steps:
            step()
            machine.keys_follow_the_rules()
    finally:
        machine.teardown()


def test_a_resume_that_read_before_a_fire_does_not_re_arm_the_fired_slot(
    on_server: type[Interleavings],
) -> None:
    # What the state machine found on resume.lua before it compared what resume read.
    m = on_server()
    replay(
        m,
        lambda: m.register_all([EVERY_SECOND, EVERY_SECOND], [True, False]),  # a parked at T0 + 1s
        lambda: m.resume_read("a"),  # writer A reads the parked T0 + 1s, and stalls
        lambda: m.resume("a"),  # writer B resumes it at T0 + 1s
        lambda: m.pump(1_000),  # a pump fires T0 + 1s
        lambda: m.pause("a"),  # B pauses it again, parked at T0 + 2s
        lambda: m.write(0),  # A must not put it back at T0 + 1s
        lambda: m.pump(0),
    )


def test_a_sync_planned_before_a_fire_does_not_move_the_score_back(
    on_server: type[Interleavings],
) -> None:
    # What the state machine found on upsert.lua before it held the last fired slot.
    m = on_server()
    replay(
        m,
        lambda: m.register_all([EVERY_3S, EVERY_3S], [False, False]),  # next run T0 + 3s
        lambda: m.sync_read({"a": EVERY_SECOND}),  # a new cadence, from now = T0
        lambda: m.pump(3_000),  # a pump fires T0 + 3s
        lambda: m.write(0),  # the first run T0 + 1s is before it: T0 + 4s instead
        lambda: m.pump(1_000),
    )
