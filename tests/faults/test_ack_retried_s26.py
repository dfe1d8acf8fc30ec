"""An ack that fails after the broker accepted a batch is retried while its leases last.

Redis dies between the broker's accept and the ack (killed, then restarted from its AOF, as
a short outage or a restart does; a cluster slot migrating fails the ack the same way for
seconds): the pump keeps the ack and makes it at the queue's next ticks, so once the lease
would have expired nothing is sent twice and `fired` counts each occurrence once. Only an
ack whose leases expired before Redis came back is given up, with one warning, and its
occurrences go out again (same ids, marked redelivered), as guarantees.md says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from emq_bridge import Occurrence, Pump, PumpEvents, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import RegistryError, RegistryUnavailable
from emq_bridge.pump import BROKEN_RETRY_S
from emq_bridge.testing import ManualClock

from .conftest import free_port

pytestmark = pytest.mark.faults

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
HOUR = 3_600_000
LEASE_MS = 60_000  # the default lease
QUEUE = "acked"
NAMES = [f"job-{i}" for i in range(5)]


class Server:
    """An embedded server whose writes survive a SIGKILL (AOF, fsync always)."""

    def __init__(self, directory: Path) -> None:
        self.embedded = EmbeddedServer(
            port=free_port(),
            directory=str(directory),
            extra_args=["--appendonly", "yes", "--appendfsync", "always"],
        )

    def kill(self) -> None:
        self.embedded.kill()

    def restart(self) -> None:
        self.embedded.start()


class DyingAfterAccept:
    """A broker that accepts the whole batch, after which Redis dies before the pump acks."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.sent: list[Occurrence] = []
        self.kill_next = True

    def dispatch(self, occurrence: Occurrence) -> None:
        self.dispatch_batch([occurrence])

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        self.sent.extend(occurrences)
        if self.kill_next:
            self.kill_next = False
            self.server.kill()
        return [None] * len(occurrences)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    made = Server(tmp_path)
    made.restart()
    yield made
    made.embedded.stop()


@pytest.fixture
def repeat(server: Server) -> Iterator[Repeat]:
    client = redis.Redis.from_url(server.embedded.url, socket_timeout=5)
    made = Repeat(client, "s26")
    for name in NAMES:
        made.register(QUEUE, name, every="1h", template={"task": "t"}, now_ms=T0)
    yield made
    client.close()


def step_until_acked(pump: Pump, timeout_s: float = 10.0) -> None:
    """Tick as `run` does until a tick goes through (the restarted server may be loading)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tick, delay = pump.step()
        if tick is not None:
            return
        time.sleep(min(delay, 0.05))
    raise AssertionError(f"no tick went through within {timeout_s}s")


def fired(repeat: Repeat) -> dict[str, int]:
    return {r.name: r.fired for r in repeat.list(QUEUE)}


def dies_after_the_accept(server: Server, repeat: Repeat) -> tuple[Pump, DyingAfterAccept]:
    """A pump (default lease) whose first batch is accepted, then its ack meets a dead Redis;
    the tick reports the outage and the next one comes within a second."""
    clock = ManualClock(T0 + HOUR)  # every registration is due
    broker = DyingAfterAccept(server)
    pump = Pump(repeat, [QUEUE], broker, clock=clock)
    assert pump.lease_ms == LEASE_MS
    tick, delay = pump.step()
    assert tick is None  # the outage
    assert delay <= BROKEN_RETRY_S  # a pending ack is tried again long before its lease ends
    assert sorted(o.name for o in broker.sent) == NAMES
    return pump, broker


def test_an_ack_that_met_a_redis_restart_is_retried_and_nothing_is_sent_twice(
    server: Server, repeat: Repeat
) -> None:
    pump, broker = dies_after_the_accept(server, repeat)
    server.restart()
    step_until_acked(pump)
    assert repeat.leases(QUEUE) == []
    assert fired(repeat) == dict.fromkeys(NAMES, 1)

    # Past the lease the batch would have held: nothing is sent again, nothing counted twice.
    assert isinstance(pump.clock, ManualClock)
    pump.clock.advance(LEASE_MS + 1)
    step_until_acked(pump)
    ids = [o.id for o in broker.sent]
    assert len(ids) == len(set(ids)) == len(NAMES)
    assert not any(o.redelivered for o in broker.sent)
    assert fired(repeat) == dict.fromkeys(NAMES, 1)


class FlakyAcks(Repeat):
    """A Repeat whose batch acks fail as planned, one fault per ack, then go through:
    "lost", the script runs and its reply is lost (the connection drops between the two);
    "migrating", refused before it runs, as redis-py's "TTL exhausted." on a slot that
    migrates (a `RegistryError`, not an outage)."""

    def __init__(self, client: redis.Redis, prefix: str, faults: Sequence[str]) -> None:
        super().__init__(client, prefix)
        self.faults = list(faults)
        self.batch_acks = 0  # the acks that named leases: the first try, then its retries

    def ack(
        self,
        queue: str,
        lease_members: Sequence[str],
        *,
        deadline_ms: int | None = None,
        released_ms: int | None = None,
        hand_back: Sequence[str] = (),
    ) -> int | None:
        fault = self.faults.pop(0) if lease_members and self.faults else None
        self.batch_acks += bool(lease_members)
        if fault == "migrating":
            raise RegistryError(f"ack {queue}: the Redis Cluster kept redirecting: TTL exhausted.")
        result = super().ack(
            queue,
            lease_members,
            deadline_ms=deadline_ms,
            released_ms=released_ms,
            hand_back=hand_back,
        )
        if fault == "lost":
            raise RegistryUnavailable(f"ack {queue}: Redis is unreachable (ConnectionError)")
        return result


def flaky_pump(server: Server, faults: Sequence[str]) -> tuple[Pump, FlakyAcks, ManualClock]:
    repeat = FlakyAcks(redis.Redis.from_url(server.embedded.url), "s26-flaky", faults)
    for name in NAMES:
        repeat.register(QUEUE, name, every="1h", template={"task": "t"}, now_ms=T0)
    broker = DyingAfterAccept(server)
    broker.kill_next = False  # Redis stays up: only the acks fail
    clock = ManualClock(T0 + HOUR)
    return Pump(repeat, [QUEUE], broker, clock=clock), repeat, clock


def test_retrying_an_ack_whose_script_ran_counts_fired_once(server: Server) -> None:
    pump, repeat, clock = flaky_pump(server, ["lost"])
    tick, _ = pump.step()
    assert tick is None
    assert fired(repeat) == dict.fromkeys(NAMES, 1)  # the script ran
    step_until_acked(pump)  # the retry: fenced, it finds no lease at its deadline
    assert repeat.batch_acks == 2
    clock.advance(LEASE_MS + 1)
    step_until_acked(pump)
    assert fired(repeat) == dict.fromkeys(NAMES, 1)
    assert isinstance(pump.dispatcher, DyingAfterAccept)
    assert len(pump.dispatcher.sent) == len(NAMES)


class QueueErrors(PumpEvents):
    def __init__(self) -> None:
        self.told: list[str] = []

    def on_queue_error(self, queue: str, error: BaseException) -> None:
        self.told.append(f"error {queue}")

    def on_queue_recover(self, queue: str) -> None:
        self.told.append(f"recover {queue}")


def test_an_ack_refused_while_a_slot_migrates_is_retried_each_second_until_it_goes_through(
    server: Server,
) -> None:
    pump, repeat, clock = flaky_pump(server, ["migrating", "migrating"])
    errors = QueueErrors()
    pump.add_listener(errors)
    tick, delay = pump.step()  # the ack is refused: the queue is broken, retried in a second
    assert tick is not None and delay <= BROKEN_RETRY_S
    assert len(repeat.leases(QUEUE)) == len(NAMES)
    clock.advance(1_000)
    tick, delay = pump.step()  # its retry is refused too: it stays
    assert tick is not None and delay <= BROKEN_RETRY_S
    assert repeat.batch_acks == 2 and len(repeat.leases(QUEUE)) == len(NAMES)
    clock.advance(1_000)
    pump.step()  # the slot has moved: the ack goes through
    assert repeat.batch_acks == 3 and repeat.leases(QUEUE) == []
    assert errors.told == [f"error {QUEUE}", f"recover {QUEUE}"]  # told once, as any error
    clock.advance(LEASE_MS)
    pump.step()
    assert isinstance(pump.dispatcher, DyingAfterAccept)
    assert len({o.id for o in pump.dispatcher.sent}) == len(pump.dispatcher.sent) == len(NAMES)
    assert fired(repeat) == dict.fromkeys(NAMES, 1)


def test_an_ack_whose_leases_expired_before_redis_came_back_is_dropped_and_redelivered(
    server: Server, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="emq_bridge.pump")
    pump, broker = dies_after_the_accept(server, repeat)
    assert isinstance(pump.clock, ManualClock)
    pump.clock.advance(LEASE_MS)  # the leases' deadline: expired at the next scan
    server.restart()
    step_until_acked(pump)

    given_up = [r.getMessage() for r in caplog.records if "could be retried" in r.getMessage()]
    assert given_up == [
        f"{QUEUE}: the ack of {len(NAMES)} sent occurrence(s) failed and their leases expired "
        "before it could be retried: they may be sent again (same ids, marked redelivered)"
    ]
    first, again = broker.sent[: len(NAMES)], broker.sent[len(NAMES) :]
    assert sorted(o.id for o in again) == sorted(o.id for o in first)
    assert all(o.redelivered for o in again)
    assert repeat.leases(QUEUE) == []
    assert fired(repeat) == dict.fromkeys(NAMES, 1)  # counted by the redelivery's ack


class BackAndStop(PumpEvents):
    """Told of the outage, Redis comes back and the pump is asked to stop at once: only the
    retry `run` makes as it ends can ack the batch before its lease expires."""

    def __init__(self, server: Server, stop: threading.Event) -> None:
        self.server, self.stop = server, stop

    def on_outage_begin(self, error: BaseException) -> None:
        self.server.restart()
        self.stop.set()


def test_a_pump_that_stops_during_the_outage_makes_the_failed_ack_as_it_ends(
    server: Server, repeat: Repeat
) -> None:
    stop = threading.Event()
    broker = DyingAfterAccept(server)
    pump = Pump(
        repeat,
        [QUEUE],
        broker,
        clock=ManualClock(T0 + HOUR),
        listeners=[BackAndStop(server, stop)],
    )
    pump.run(stop)
    assert repeat.leases(QUEUE) == []
    assert fired(repeat) == dict.fromkeys(NAMES, 1)


def test_a_stop_while_redis_is_still_down_never_raises_and_says_so_once(
    server: Server, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="emq_bridge.pump")
    stop = threading.Event()

    class StopOnly(PumpEvents):
        def on_outage_begin(self, error: BaseException) -> None:
            stop.set()

    pump = Pump(
        repeat,
        [QUEUE],
        DyingAfterAccept(server),
        clock=ManualClock(T0 + HOUR),
        listeners=[StopOnly()],
    )
    pump.run(stop)  # returns
    told = [r.getMessage() for r in caplog.records if "could not be acked" in r.getMessage()]
    assert len(told) == 1
    assert told[0].startswith(f"stopping: {len(NAMES)} sent occurrence(s) could not be acked")
