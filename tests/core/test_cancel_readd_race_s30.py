"""A registration cancelled and added again (as a web app editing a schedule does) while a
pump fires it is a fresh registration, not a corrupt one (found by a probe, session 30:
the pump, reading no record between the cancel and the re-add, logged at ERROR "parked for
60s: registry member has no record" and, when the re-add kept the slot, moved the fresh
registration a minute on; a permanent failure of the cancelled one's occurrence parked the
fresh one). The race is made deterministic by cancelling and re-adding between the pump's
round trips (its registry calls wrapped), never by sleeping. Real server and fakeredis."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.errors import PermanentDispatchError
from emq_bridge.pump import CORRUPT_PARK_MS
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000
SECOND = 1000
TEMPLATE = {"task": "t"}


def add(repeat: Repeat, name: str) -> None:
    """Register `name` every second from T0: its first run is T0 + 1 s, the slot the
    pump's scan reads, so a re-add keeps the score the claim compares."""
    repeat.register("q", name, every="1s", template=TEMPLATE, now_ms=T0)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def wrap(
    monkeypatch: pytest.MonkeyPatch,
    repeat: Repeat,
    method: str,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> None:
    """Run `before` and `after` around the first call of `repeat.<method>` (a round trip)."""
    original = getattr(repeat, method)
    calls = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) > 1:
            return original(*args, **kwargs)
        before()
        try:
            return original(*args, **kwargs)
        finally:
            after()

    monkeypatch.setattr(repeat, method, hooked)


@pytest.mark.parametrize(
    "readded", ["after the read", "before the claim", "after the claim"], ids=str
)
def test_a_registration_cancelled_before_the_pump_reads_it_and_added_again_is_not_parked(
    any_repeat: Repeat,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    readded: str,
) -> None:
    add(any_repeat, "edited")
    add(any_repeat, "kept")
    cancel = lambda: any_repeat.cancel("q", "edited")  # noqa: E731
    readd = lambda: add(any_repeat, "edited")  # noqa: E731
    if readded == "after the read":  # the probe's race: the pump reads no record
        wrap(monkeypatch, any_repeat, "load_records", before=cancel, after=readd)
    else:
        wrap(monkeypatch, any_repeat, "load_records", before=cancel)
        when = {"before the claim": "before", "after the claim": "after"}[readded]
        wrap(monkeypatch, any_repeat, "claim", **{when: readd})
    dispatcher = RecordingDispatcher()
    pump = Pump(any_repeat, ["q"], dispatcher)

    with caplog.at_level(logging.DEBUG, logger="emq_bridge"):
        tick = pump.run_once(now_ms=T0 + SECOND)

    assert errors(caplog) == [] and tick.parked == []
    assert dispatcher.names() == ["kept"]
    # The fresh registration keeps its first run, not a corrupt record's minute aside...
    assert any_repeat.client.zscore(any_repeat.keys("q").registry, "edited") == T0 + SECOND
    # ...and fires at the next tick.
    pump.run_once(now_ms=T0 + SECOND)
    assert dispatcher.names() == ["kept", "edited"]


def test_a_member_whose_record_is_still_missing_at_the_claim_is_parked_with_one_error(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    add(any_repeat, "orphan")
    add(any_repeat, "kept")
    any_repeat.client.delete(any_repeat.keys("q").record("orphan"))  # by hand: corrupt
    dispatcher = RecordingDispatcher()

    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        tick = Pump(any_repeat, ["q"], dispatcher).run_once(now_ms=T0 + SECOND)

    assert dispatcher.names() == ["kept"] and tick.parked == ["orphan"]
    [line] = errors(caplog)
    assert "q/orphan: parked for 60s: registry member has no record" in line
    score = any_repeat.client.zscore(any_repeat.keys("q").registry, "orphan")
    assert score == T0 + SECOND + CORRUPT_PARK_MS
    assert not any_repeat.client.exists(any_repeat.keys("q").record("orphan"))  # none made


def test_a_member_registered_again_between_the_read_and_the_claim_is_not_set_aside(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim decides from what it reads: a record there by then (a register that
    recreated one a hand deleted) is a registration, not the corrupt member read."""
    add(any_repeat, "orphan")
    any_repeat.client.delete(any_repeat.keys("q").record("orphan"))
    wrap(monkeypatch, any_repeat, "claim", before=lambda: add(any_repeat, "orphan"))

    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        tick = Pump(any_repeat, ["q"], RecordingDispatcher()).run_once(now_ms=T0 + SECOND)

    assert errors(caplog) == [] and tick.parked == []
    assert any_repeat.client.zscore(any_repeat.keys("q").registry, "orphan") == T0 + SECOND


def test_an_expired_lease_of_a_registration_with_no_record_is_dropped_not_told_parked(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the lease is dropped there: no park is made, so none is told."""
    any_repeat.client.zadd(any_repeat.keys("q").leases, {f"gone {T0} triggered": T0})

    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        tick = Pump(any_repeat, ["q"], RecordingDispatcher()).run_once(now_ms=T0 + SECOND)

    assert tick.parked == [] and any_repeat.leases("q") == []
    [line] = errors(caplog)
    assert "dropped: the registration is gone or corrupt" in line and "parked" not in line


class CancelledWhileSent:
    """Fails every send for good, after cancelling the registration and adding it again
    (the same template) while the send is in progress."""

    def __init__(self, repeat: Repeat) -> None:
        self.repeat = repeat

    def dispatch(self, occurrence: Occurrence) -> None:
        self.repeat.cancel(occurrence.queue, occurrence.name)
        add(self.repeat, occurrence.name)
        raise PermanentDispatchError(f"{occurrence.queue}/{occurrence.name}: unknown task")


def test_a_permanent_failure_of_a_cancelled_registration_does_not_park_the_one_added_again(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    add(any_repeat, "edited")

    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        tick = Pump(any_repeat, ["q"], CancelledWhileSent(any_repeat)).run_once(now_ms=T0 + SECOND)

    assert tick.parked == [] and errors(caplog) == []
    fresh = any_repeat.get("q", "edited")
    assert fresh is not None and not fresh.paused and fresh.parked_reason is None
    assert fresh.next_run_ms == T0 + SECOND
    assert any_repeat.leases("q") == []
