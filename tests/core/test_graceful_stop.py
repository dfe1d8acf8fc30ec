"""A graceful stop settles the batch in hand: nothing claimed waits out its lease.

What the broker accepted is acked; what the pump did not send is handed back (its lease
expires at once), so the next tick of any pump sends it, with the same id. Whatever ends the
batch: `stop()`, SIGTERM of the `pump` command, or a `SystemExit` / `KeyboardInterrupt`
raised while sending (Celery's beat signal handler raises `SystemExit` inside its tick).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest
import redis
from quiet import quiet_offset

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.dispatch import ListPushDispatcher
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000
HOUR = 3_600_000
LEASE_MS = 60_000


def register_due(
    repeat: Repeat, queue: str, n: int, now_ms: int, offset: str | None = None
) -> None:
    """Register `n` hourly schedules in `queue`, all due at `now_ms` (on the grid shifted by
    `offset`)."""
    definition = define(every="1h", offset=offset, template={"task": "t"})
    items = [(queue, f"job-{i:05d}", definition) for i in range(n)]
    repeat.upsert_many(items, now_ms=now_ms - HOUR)


def future_leases(repeat: Repeat, queue: str, now_ms: int) -> list[tuple[str, int, int]]:
    return [lease for lease in repeat.leases(queue) if lease[2] > now_ms]


class InterruptedAt:
    """Accepts occurrences until the `at`-th, where it raises `error` (a signal handler's)."""

    def __init__(self, at: int, error: BaseException) -> None:
        self.at = at
        self.error = error
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        if len(self.sent) == self.at:
            raise self.error
        self.sent.append(occurrence)


@pytest.mark.parametrize("error", [SystemExit(), KeyboardInterrupt()], ids=type)
def test_an_exit_raised_while_sending_acks_what_was_sent_and_hands_back_the_rest(
    any_repeat: Repeat, error: BaseException
) -> None:
    register_due(any_repeat, "q", 50, T0)
    broker = InterruptedAt(20, error)
    with pytest.raises(type(error)):
        Pump(any_repeat, ["q"], broker, lease_ms=LEASE_MS).run_once(now_ms=T0)

    assert len(broker.sent) == 20
    assert future_leases(any_repeat, "q", T0) == []
    # The first batch of a burst is 32: its 12 not sent are handed back (expired at once).
    assert [deadline for _, _, deadline in any_repeat.leases("q")] == [0] * 12
    # The next pump sends the rest at once, each with its own id: none twice, none lost.
    rest = RecordingDispatcher()
    Pump(any_repeat, ["q"], rest).run_once(now_ms=T0 + 1)
    assert len(rest.occurrences) == 30
    assert sum(o.redelivered for o in rest.occurrences) == 12
    ids = Counter(o.id for o in broker.sent + rest.occurrences)
    assert len(ids) == 50 and set(ids.values()) == {1}
    assert any_repeat.leases("q") == []
    fired = [r.fired for r in any_repeat.list("q")]
    assert fired == [1] * 50


class BatchInterrupted:
    """A batch dispatcher interrupted inside its one publish: nothing is known to be in."""

    def __init__(self) -> None:
        self.calls = 0

    def dispatch(self, occurrence: Occurrence) -> None:
        raise AssertionError("the batch path is used")

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        self.calls += 1
        raise SystemExit


def test_an_exit_inside_a_batch_publish_hands_back_the_whole_batch(any_repeat: Repeat) -> None:
    register_due(any_repeat, "q", 10, T0)
    with pytest.raises(SystemExit):
        Pump(any_repeat, ["q"], BatchInterrupted()).run_once(now_ms=T0)
    assert future_leases(any_repeat, "q", T0) == []
    rest = RecordingDispatcher()
    Pump(any_repeat, ["q"], rest).run_once(now_ms=T0 + 1)
    assert len({o.id for o in rest.occurrences}) == 10


class Slow:
    """Takes `seconds` per occurrence, and says when `after` of them are in."""

    def __init__(self, seconds: float, after: int) -> None:
        self.seconds = seconds
        self.after = after
        self.sent: list[Occurrence] = []
        self.started = threading.Event()

    def dispatch(self, occurrence: Occurrence) -> None:
        if len(self.sent) >= self.after:
            self.started.set()
        time.sleep(self.seconds)
        self.sent.append(occurrence)


def test_stop_during_a_slow_batch_returns_at_once_and_hands_back_what_is_left(
    repeat: Repeat,
) -> None:
    now = repeat.server_time_ms()
    # Real pumps: a top of the hour mid-test would make all 400 due again.
    register_due(repeat, "q", 400, now, offset=quiet_offset())
    # A burst's batches are 32, then 128: stopped in the second, 128 x 50 ms would take 6 s.
    slow = Slow(0.05, after=34)
    pump = Pump(repeat, ["q"], slow, batch_size=400, lease_ms=LEASE_MS)
    thread = threading.Thread(target=pump.run, daemon=True)
    thread.start()
    try:
        assert slow.started.wait(30)
        stopped_at = time.monotonic()
        pump.stop()
        thread.join(30)
        took_s = time.monotonic() - stopped_at
    finally:
        pump.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert took_s < 3, f"stop took {took_s:.1f}s; the rest of the batch takes 5 s"
    assert 34 < len(slow.sent) < 32 + 128
    assert future_leases(repeat, "q", repeat.server_time_ms()) == []
    rest = RecordingDispatcher()
    Pump(repeat, ["q"], rest).run_once()
    ids = Counter(o.id for o in slow.sent + rest.occurrences)
    assert len(ids) == 400 and set(ids.values()) == {1}


def test_sigterm_to_the_pump_command_during_a_burst_leaves_nothing_leased(
    redis_url: str, prefix: str, repeat: Repeat, client: redis.Redis
) -> None:
    queue, out_key = "burst", f"{prefix}:out"
    # Real pumps: a top of the hour mid-test would make all 3,000 due again.
    register_due(repeat, queue, 3_000, repeat.server_time_ms(), offset=quiet_offset())
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    command += ["pump", queue, "--list-key", out_key]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not client.llen(out_key) and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.005)
        process.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        _, stderr = process.communicate(timeout=30)
        took_s = time.monotonic() - stopping
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert took_s < 5, f"the pump took {took_s:.1f}s to stop"
    assert future_leases(repeat, queue, repeat.server_time_ms()) == []
    Pump(repeat, [queue], ListPushDispatcher(client, out_key)).run_once()
    ids = Counter(json.loads(raw)["id"] for raw in client.lrange(out_key, 0, -1))
    assert len(ids) == 3_000, len(ids)
    assert set(ids.values()) == {1}, [i for i, n in ids.items() if n > 1][:5]
    assert repeat.leases(queue) == []
