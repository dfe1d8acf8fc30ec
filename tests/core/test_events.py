"""Pump events: every listener hears what the pump did, and none can stop it."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import pytest
import redis
from celery import Celery

from emq_bridge import Occurrence, Pump, PumpEvents, Repeat, Tick
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import DispatchError
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
TEMPLATE = {"task": "reports.digest"}


class Journal(PumpEvents):
    """Writes down every event, as (event, detail)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def on_tick(self, tick: Tick) -> None:
        self.seen.append(("tick", len(tick.dispatched)))

    def on_claim(self, queue: str, occurrences: Sequence[Occurrence]) -> None:
        self.seen.append(("claim", sorted(o.name for o in occurrences)))

    def on_redispatch(self, occurrence: Occurrence) -> None:
        self.seen.append(("redispatch", occurrence.name))

    def on_dispatch(self, occurrence: Occurrence) -> None:
        self.seen.append(("dispatch", occurrence.name))

    def on_dispatch_failure(self, occurrence: Occurrence, error: BaseException) -> None:
        self.seen.append(("failure", f"{occurrence.name}: {error}"))

    def on_missed(self, queue: str, name: str, missed: int, due_ms: int) -> None:
        self.seen.append(("missed", (name, missed, due_ms)))

    def on_park(self, queue: str, name: str, reason: str, park_ms: int) -> None:
        self.seen.append(("park", name))

    def on_lease_dropped(self, queue: str, member: str, reason: str) -> None:
        self.seen.append(("lease dropped", member))

    def on_outage_begin(self, error: BaseException) -> None:
        self.seen.append(("outage begin", type(error).__name__))

    def on_outage_end(self, seconds: float) -> None:
        self.seen.append(("outage end", seconds >= 0))

    def of(self, event: str) -> list[object]:
        return [detail for name, detail in self.seen if name == event]


class Refuses:
    """A dispatcher whose broker refuses `refused`, and takes the rest."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        if occurrence.name == self.refused:
            raise DispatchError("the broker said no")
        self.sent.append(occurrence)

    @staticmethod
    def down(occurrence: Occurrence) -> None:
        raise DispatchError("the broker is down")


def test_a_listener_hears_the_claim_each_dispatch_and_the_tick(any_repeat: Repeat) -> None:
    for name in ("a", "b"):
        any_repeat.register("reports", name, every="1m", template=TEMPLATE, now_ms=T0)
    journal = Journal()
    Pump(any_repeat, ["reports"], RecordingDispatcher(), listeners=[journal]).run_once(
        now_ms=T0 + 60_000
    )
    # Equal scores are claimed, so dispatched, in name order.
    assert journal.seen == [
        ("claim", ["a", "b"]),
        ("dispatch", "a"),
        ("dispatch", "b"),
        ("tick", 2),
    ]


def test_a_refused_occurrence_is_a_dispatch_failure_and_later_a_redispatch(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    any_repeat.register("reports", "ghost", every="1h", template=TEMPLATE, now_ms=T0)
    journal = Journal()
    dispatcher = Refuses("ghost")
    pump = Pump(any_repeat, ["reports"], dispatcher, lease_ms=1000, listeners=[journal])
    pump.run_once(now_ms=T0 + 3_600_000)
    assert journal.of("failure") == ["ghost: the broker said no"]
    dispatcher.refused = ""  # the broker is back
    with caplog.at_level(logging.WARNING, logger="emq_bridge.pump"):
        pump.run_once(now_ms=T0 + 3_600_000 + 1001)
    assert journal.of("redispatch") == ["ghost"]
    assert [o.redelivered for o in dispatcher.sent] == [True]
    # The default logging listener says which occurrence is sent again, and when it was due.
    [line] = [r.getMessage() for r in caplog.records if "lease expired" in r.getMessage()]
    assert dispatcher.sent[0].id in line and "2030-03-17T01:00:00" in line  # T0 + 1h


def test_missed_slots_and_parked_records_are_events(any_repeat: Repeat) -> None:
    any_repeat.register(
        "reports", "late", every="10m", anchor="schedule", template=TEMPLATE, now_ms=T0
    )
    any_repeat.register("reports", "bad", every="10m", template=TEMPLATE, now_ms=T0)
    any_repeat.client.hset(any_repeat.keys("reports").record("bad"), "every_ms", "soon")
    journal = Journal()
    Pump(any_repeat, ["reports"], RecordingDispatcher(), listeners=[journal]).run_once(
        now_ms=T0 + 35 * 60_000
    )
    # The default policy fires the newest slot, 30 min; the 10 and 20 min slots are dropped.
    assert journal.of("missed") == [("late", 2, T0 + 30 * 60_000)]
    assert journal.of("park") == ["bad"]


def test_a_listener_that_raises_is_logged_once_and_stops_neither_the_pump_nor_the_others(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(PumpEvents):
        def on_dispatch(self, occurrence: Occurrence) -> None:
            raise RuntimeError("a listener bug")

    for name in ("a", "b", "c"):
        any_repeat.register("reports", name, every="1m", template=TEMPLATE, now_ms=T0)
    journal = Journal()
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder, listeners=[Broken()])
    pump.add_listener(journal)
    with caplog.at_level(logging.ERROR, logger="emq_bridge.pump"):
        tick = pump.run_once(now_ms=T0 + 60_000)
    assert len(tick.dispatched) == 3 and sorted(recorder.names()) == ["a", "b", "c"]
    assert sorted(str(d) for d in journal.of("dispatch")) == ["a", "b", "c"]
    failures = [r for r in caplog.records if "listener Broken failed" in r.getMessage()]
    assert len(failures) == 1
    assert any_repeat.leases("reports") == []  # every dispatched occurrence was acked


def test_an_outage_is_one_begin_and_one_end_event(redis_url: str, prefix: str) -> None:
    # A pump on a port where nothing listens, then on the real server.
    dead = Repeat(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), prefix)
    journal = Journal()
    pump = Pump(dead, ["reports"], RecordingDispatcher(), listeners=[journal])
    assert pump.step()[0] is None and pump.step()[0] is None
    assert journal.of("outage begin") == ["RegistryUnavailable"]
    pump.repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    tick, _ = pump.step()
    assert tick is not None
    assert journal.of("outage end") == [True]
    assert journal.of("tick") == [0]
    pump.repeat.close()


def test_a_broker_refusing_every_send_logs_one_line_each_and_one_debug_traceback(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: one traceback per failed send, each lease again (960 in 75 s for a refusing
    # broker); then the first failure of each error type came with a traceback at ERROR and
    # no cause on its line. Now every failure is one ERROR line with its cause, and the
    # traceback of the first of its type goes to DEBUG, until a send goes through.
    for name in ("a", "b", "c"):
        any_repeat.register("reports", name, every="1m", template=TEMPLATE, now_ms=T0)
    dispatcher = Refuses("")
    dispatcher.dispatch = Refuses.down  # type: ignore[method-assign, assignment]
    pump = Pump(any_repeat, ["reports"], dispatcher, lease_ms=1000)

    def failures(now_ms: int) -> tuple[list[logging.LogRecord], list[logging.LogRecord]]:
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="emq_bridge.pump"):
            pump.run_once(now_ms=now_ms)
        mine = [r for r in caplog.records if "dispatch of occurrence" in r.getMessage()]
        errors = [r for r in mine if r.levelno == logging.ERROR]
        assert all(r.exc_info is None for r in errors)
        assert all(
            r.getMessage().endswith("retried after the lease: DispatchError: the broker is down")
            for r in errors
        )
        return errors, [r for r in mine if r.levelno == logging.DEBUG and r.exc_info]

    errors, traced = failures(T0 + 60_000)
    assert len(errors) == 3 and len(traced) == 1
    errors, traced = failures(T0 + 61_001)  # the leases expired: re-sent, refused again
    assert len(errors) == 3 and traced == []

    dispatcher.dispatch = dispatcher.sent.append  # type: ignore[method-assign, assignment]
    assert failures(T0 + 62_002) == ([], []) and len(dispatcher.sent) == 3
    dispatcher.dispatch = Refuses.down  # type: ignore[method-assign, assignment]
    errors, traced = failures(T0 + 120_000)  # down again after a send went through: traced
    assert len(errors) == 3 and len(traced) == 1


def test_a_celery_broker_that_goes_down_logs_its_first_failed_send_in_one_line(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: `celery beat -S emq` whose broker went down logged the first failed send with
    # no cause on its line and ~75 lines of chained traceback (redis ConnectionError ->
    # kombu BatchPublishError -> DispatchError) at ERROR; only the later ones were one line.
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register("reports", "digest", every="1m", template=TEMPLATE, now_ms=T0)
    with EmbeddedServer() as broker:
        app = Celery(f"{prefix}-down", broker=broker.url)
        app.conf.update(result_backend=None, broker_connection_retry=False)
        pump = Pump(repeat, ["reports"], CeleryDispatcher(app), lease_ms=1000)
        assert len(pump.run_once(now_ms=T0 + 60_000).dispatched) == 1  # the broker is up
    with caplog.at_level(logging.INFO, logger="emq_bridge.pump"):
        first = pump.run_once(now_ms=T0 + 120_000)  # the broker is down
        again = pump.run_once(now_ms=T0 + 121_001)  # its lease expired: re-sent, refused
    app.close()
    repeat.close()
    assert len(first.failed) == 1 and len(again.failed) == 1
    lines = [r for r in caplog.records if "dispatch of occurrence" in r.getMessage()]
    assert [r.levelname for r in lines] == ["ERROR", "ERROR"]
    assert all(r.exc_info is None for r in lines)
    for record in lines:
        line = record.getMessage()
        assert "\n" not in line
        assert re.search(
            r"retried after the lease: DispatchError: .*(ConnectionError|Error 111)", line
        )
    assert "Traceback" not in caplog.text
