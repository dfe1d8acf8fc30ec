"""Leases: a pump acks only what it still holds, and a slow send re-sends at most itself."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest
import redis
from quiet import quiet_offset

from emq_bridge import Occurrence, Pump, PumpEvents, Repeat
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000
TEMPLATE = {"task": "t"}


def claim_due(repeat: Repeat, queue: str, now_ms: int, lease_ms: int) -> list[str]:
    """Claim what is due as a pump would, without sending or acking; return the leases."""
    scan = repeat.scan(queue, 100, now_ms)
    candidates = [(name, score, score + HOUR, 0, "fire") for name, score in scan.due]
    claim = repeat.claim(queue, now_ms, lease_ms, candidates, scan.expired)
    return [f"{candidates[i][0]} {candidates[i][1]}" for i in claim.claimed] + claim.released


def test_a_late_ack_leaves_the_lease_another_pump_took_after_it_expired(repeat: Repeat) -> None:
    repeat.register("q", "job", every="1h", template=TEMPLATE, now_ms=T0)
    due = T0 + HOUR
    [first] = claim_due(repeat, "q", due, lease_ms=1000)  # pump A, which then freezes
    [again] = claim_due(repeat, "q", due + 1001, lease_ms=1000)  # pump B re-takes it
    assert first == again
    # A wakes up and acks what it sent an hour ago: B's lease is not A's to drop.
    repeat.ack("q", [first], deadline_ms=due + 1000)
    assert repeat.leases("q") == [("job", due, due + 2001)]
    repeat.ack("q", [again], deadline_ms=due + 2001)
    assert repeat.leases("q") == []


class Slow:
    """A broker that takes `seconds[name]` to accept an occurrence (0.15 s by default)."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        time.sleep(self.seconds.get(occurrence.name, 0.15))
        self.sent.append(occurrence)


class SlowBatch:
    """A batch dispatcher (the Dramatiq and pipelined Celery paths' shape)."""

    def __init__(self) -> None:
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        self.sent.append(occurrence)

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        self.sent.extend(occurrences)
        return [None] * len(occurrences)


class HeldBatch(SlowBatch):
    """A batch dispatcher held `seconds` in its publish, after the pump's lease check (a
    slow broker, or the process stopped mid-send)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        time.sleep(self.seconds)
        return super().dispatch_batch(occurrences)


class Lost(PumpEvents):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.late: list[str] = []  # told by `on_sent_late`

    def on_lease_lost(self, occurrence: Occurrence) -> None:
        self.names.append(occurrence.name)

    def on_sent_late(self, queue: str, occurrences: Sequence[Occurrence], late_s: float) -> None:
        assert late_s > 0
        self.late += [o.name for o in occurrences]


class Stall(PumpEvents):
    """A listener that holds the pump `seconds` once it has claimed (a slow listener, a GC
    pause or a frozen process between the claim and the first send)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_claim(self, queue: str, occurrences: list[Occurrence]) -> None:
        time.sleep(self.seconds)
        self.seconds = 0


def race(
    redis_url: str,
    prefix: str,
    seconds: dict[str, float],
    stall_s: float = 0,
    dispatcher: Slow | SlowBatch | None = None,
) -> tuple[Counter[str], Lost]:
    """Pump A sends five due occurrences slowly (`Slow(seconds)`, or `dispatcher`), leases
    0.4 s, after holding `stall_s` once it has claimed them; pump B ticks all along."""
    setup = Repeat(redis.Redis.from_url(redis_url), prefix)
    now = setup.server_time_ms()
    offset = quiet_offset()  # a top of the hour mid-race would make each job due again
    for i in range(5):
        setup.register(
            "q", f"job-{i}", every="1h", offset=offset, template=TEMPLATE, now_ms=now - HOUR - 10
        )
    slow = dispatcher if dispatcher is not None else Slow(seconds)
    fast, lost = RecordingDispatcher(), Lost()
    a = Pump(setup, ["q"], slow, lease_ms=400, listeners=[lost, Stall(stall_s)])
    done = threading.Event()
    thread = threading.Thread(target=lambda: (a.run_once(), done.set()))
    thread.start()
    b = Pump(Repeat(redis.Redis.from_url(redis_url), prefix), ["q"], fast, lease_ms=400)
    time.sleep(0.05)  # A claims first
    while not done.is_set():
        b.run_once()
        time.sleep(0.03)
    thread.join(10)
    b.run_once()
    sends = Counter(o.name for o in slow.sent) + Counter(fast.names())
    assert setup.leases("q") == []  # every send was acked by the pump that made it
    return sends, lost


def test_a_batch_sent_slowly_keeps_its_leases_so_no_other_pump_sends_it_again(
    redis_url: str, prefix: str
) -> None:
    # 5 x 0.15 s is almost twice the lease: without extending, B would re-send the tail.
    sends, lost = race(redis_url, prefix, {})
    assert sends == Counter({f"job-{i}": 1 for i in range(5)})
    assert lost.names == []


def test_one_send_slower_than_the_lease_duplicates_at_most_itself(
    redis_url: str, prefix: str
) -> None:
    # job-0 takes 0.9 s, over twice the lease: B re-takes every lease meanwhile. A then sends
    # none of the others (B does), and only job-0 may go out twice.
    sends, lost = race(redis_url, prefix, {"job-0": 0.9})
    assert {name: count for name, count in sends.items() if name != "job-0"} == {
        f"job-{i}": 1 for i in range(1, 5)
    }
    assert 1 <= sends["job-0"] <= 2
    assert sorted(lost.names) == [f"job-{i}" for i in range(1, 5)]
    assert lost.late == ["job-0"]  # accepted past its lease: told (session 29)


def test_a_pump_held_between_its_claim_and_its_first_send_sends_none_another_took(
    redis_url: str, prefix: str
) -> None:
    # A is held 0.9 s, over twice its lease, before it sends anything: B re-takes and sends
    # the five. A checks its leases before its first send and sends none of them.
    sends, lost = race(redis_url, prefix, {f"job-{i}": 0.0 for i in range(5)}, stall_s=0.9)
    assert sends == Counter({f"job-{i}": 1 for i in range(5)})
    assert sorted(lost.names) == [f"job-{i}" for i in range(5)]


def test_a_send_slower_than_the_lease_mid_batch_does_not_resend_those_sent_before_it(
    redis_url: str, prefix: str
) -> None:
    # job-0 and job-1 go out at once, then job-2 blocks 0.9 s, over twice the lease (a
    # broker holding its publishers). What was sent before it is acked while it blocks, so B
    # re-takes only job-2 and what A has not sent yet: job-0 and job-1 go out once.
    sends, lost = race(redis_url, prefix, {"job-0": 0.0, "job-1": 0.0, "job-2": 0.9})
    assert {name: count for name, count in sends.items() if name != "job-2"} == {
        f"job-{i}": 1 for i in (0, 1, 3, 4)
    }
    assert 1 <= sends["job-2"] <= 2
    assert sorted(lost.names) == ["job-3", "job-4"]


def test_a_batch_publish_held_past_its_lease_after_the_claim_sends_none_another_took(
    redis_url: str, prefix: str
) -> None:
    # The batch path too: A is held 0.9 s between its claim and its publish (a slow server
    # answering the claim late, a pause), its leases expire and B sends the five. A checks
    # its leases before the publish and publishes none of them.
    sends, lost = race(redis_url, prefix, {}, stall_s=0.9, dispatcher=SlowBatch())
    assert sends == Counter({f"job-{i}": 1 for i in range(5)})
    assert sorted(lost.names) == [f"job-{i}" for i in range(5)]


def test_a_batch_publish_held_past_its_lease_mid_send_is_told_as_sent_late(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by a probe (session 29): a pump stopped (SIGSTOP) after its lease check, inside
    # its publish, published the batch when it woke, after another pump had re-sent it: a
    # duplicate no check before the publish can fence, unmarked, and nothing said so. It is
    # now told (`on_sent_late`, a WARNING): the other pump's copies are the marked ones.
    caplog.set_level(logging.WARNING, logger="emq_bridge.pump")
    sends, lost = race(redis_url, prefix, {}, dispatcher=HeldBatch(0.9))
    assert sorted(lost.late) == [f"job-{i}" for i in range(5)]
    assert all(1 <= sends[f"job-{i}"] <= 2 for i in range(5)), sends
    [line] = [
        r.getMessage() for r in caplog.records if "after their leases expired" in r.getMessage()
    ]
    assert (
        line.startswith("q: 5 occurrence(s) reached the broker ") and "marked redelivered" in line
    )
