"""The occurrence lifecycle in the registry: reports, history, overlap, lost, pause on failures.

Real Lua on a real server (and fakeredis where it runs the same scripts). The pump's clock is
the server's (`server_time_ms`) plus offsets smaller than any deadline, so the deadlines
report.lua writes from the server clock mean what they do in production.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis

from emq_bridge import Occurrence, Pump, PumpEvents, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import ScheduleError
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import MAX_ERROR_CHARS, Report, error_text
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

TEMPLATE = {"task": "reports.digest"}


class Heard(PumpEvents):
    def __init__(self) -> None:
        self.skips: list[tuple[str, int]] = []
        self.buffers: list[tuple[str, int]] = []
        self.replaced: list[tuple[str, str, bool]] = []
        self.lost: list[tuple[str, int, str]] = []

    def on_skip(self, queue: str, name: str, due_ms: int) -> None:
        self.skips.append((name, due_ms))

    def on_buffer(self, queue: str, name: str, due_ms: int) -> None:
        self.buffers.append((name, due_ms))

    def on_replace(self, occurrence: Occurrence, previous_id: str, revoked: bool) -> None:
        self.replaced.append((occurrence.id, previous_id, revoked))

    def on_lost(self, queue: str, name: str, due_ms: int, occurrence_id: str) -> None:
        self.lost.append((name, due_ms, occurrence_id))


class Revoking(RecordingDispatcher):
    def __init__(self) -> None:
        super().__init__()
        self.revoked: list[str] = []

    def revoke(self, occurrence_id: str) -> None:
        self.revoked.append(occurrence_id)


def _start(repeat: Repeat) -> int:
    """A registration time on a whole second of the server clock, a little in the past."""
    return (repeat.server_time_ms() // 1000) * 1000 - 10_000


def _fire(pump: Pump, now_ms: int) -> list[Occurrence]:
    return pump.run_once(now_ms=now_ms).dispatched


def test_reports_are_idempotent_per_id_and_attempt(any_repeat: Repeat) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    (occurrence,) = _fire(Pump(any_repeat, ["q"], RecordingDispatcher()), t0 + 1000)

    def report(kind: str, attempt: int, at: int, **extra: object) -> int:
        item = report_of(kind, occurrence, attempt=attempt, at_ms=at, **extra)  # type: ignore[arg-type]
        return any_repeat.report([item])

    assert report("started", 1, t0 + 1100) == 1
    assert report("started", 1, t0 + 1100) == 0  # a duplicate changes nothing
    assert report("retrying", 1, t0 + 1200, error="OSError: flaky", hold_ms=500) == 1
    assert report("retrying", 1, t0 + 1200, error="OSError: flaky") == 0
    assert report("started", 2, t0 + 1700) == 1
    assert report("started", 1, t0 + 1100) == 0  # an earlier attempt, late
    assert report("succeeded", 2, t0 + 1900) == 1
    assert report("succeeded", 2, t0 + 1900) == 0
    assert report("failed", 2, t0 + 2000, error="late") == 0  # a final status is final
    (entry,) = any_repeat.history("q", "job")
    assert (entry.id, entry.status, entry.attempt) == (occurrence.id, "succeeded", 2)
    assert (entry.started_ms, entry.finished_ms, entry.duration_ms) == (t0 + 1700, t0 + 1900, 200)
    assert entry.released_ms == t0 + 1000 and entry.due_ms == t0 + 1000
    registration = any_repeat.get("q", "job")
    assert registration is not None
    assert registration.last_status == "succeeded" and registration.failures == 0
    assert registration.last_duration_ms == 200 and registration.last_success_ms == t0 + 1900
    assert registration.fired == 1  # reports never count firings


def test_a_worker_skip_is_counted_once_as_the_pumps_skips_are(any_repeat: Repeat) -> None:
    # Before: `skipped` counted the pump's skips only, while `show` and `list` said a worker
    # skipped the occurrence (Dramatiq's start check, SkipMessage, AgeLimit): "skipped 0".
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    first, second = (
        _fire(Pump(any_repeat, ["q"], RecordingDispatcher()), t0 + k * 1000)[0] for k in (1, 2)
    )
    for occurrence in (first, first, second):  # a repeated report changes nothing
        item = report_of("skipped", occurrence, at_ms=t0 + 2500)
        any_repeat.report([item])
    registration = any_repeat.get("q", "job")
    assert registration is not None and registration.skipped == 2
    assert [e.status for e in any_repeat.history("q", "job")] == ["skipped", "skipped"]


def test_a_report_of_a_registration_gone_creates_nothing(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    (occurrence,) = _fire(Pump(repeat, ["q"], RecordingDispatcher()), t0 + 1000)
    assert repeat.cancel("q", "job")
    assert repeat.finished(occurrence, ok=True) is False
    assert repeat.client.keys(f"{repeat.prefix}:*") == []


def test_cancel_removes_history_and_in_flight(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    (occurrence,) = _fire(Pump(repeat, ["q"], RecordingDispatcher()), t0 + 1000)
    assert repeat.started(occurrence)
    keys = repeat.keys("q")
    assert repeat.client.exists(keys.history("job"), keys.running) == 2
    assert repeat.cancel("q", "job")
    assert repeat.client.keys(f"{repeat.prefix}:*") == []


@pytest.mark.parametrize("then_allow", [False, True])
def test_an_end_reported_without_its_start_leaves_nothing_in_flight(
    any_repeat: Repeat, then_allow: bool
) -> None:
    """A final report alone (no `started` seen) of an occurrence a guarded claim put in flight
    takes it out of `running`, also after the policy was changed to `allow` meanwhile; one of
    an unguarded occurrence (report.lua then skips the removal) leaves `running` empty too."""
    t0 = _start(any_repeat)
    keys = any_repeat.keys("q")
    any_repeat.upsert("q", "free", every="1s", template=TEMPLATE, now_ms=t0)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    fired = {o.name: o for o in _fire(pump, t0 + 1000)}
    assert any_repeat.client.zrange(keys.running, 0, -1) == [f"job {t0 + 1000}".encode()]
    if then_allow:
        any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    assert any_repeat.finished(fired["free"], ok=True)
    assert any_repeat.finished(fired["job"], ok=True)
    assert any_repeat.client.zcard(keys.running) == 0
    assert {o.name for o in _fire(pump, t0 + 2000)} == {"free", "job"}
    for name in ("free", "job"):
        (entry,) = any_repeat.history("q", name, 1)
        assert (entry.due_ms, entry.status) == (t0 + 1000, "succeeded")


def test_history_stays_capped_under_ten_thousand_occurrences(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    reports = []
    for i in range(10_000):
        due = t0 + i
        ident = f"00000000-0000-5000-8000-{i:012d}"
        for kind in ("started", "succeeded" if i % 7 else "failed"):
            reports.append(Report(kind, "q", "job", ident, due, due + 5, error="boom"))  # type: ignore[arg-type]
    for start in range(0, len(reports), 1000):
        repeat.report(reports[start : start + 1000], history_size=50)
    keys = repeat.keys("q")
    assert repeat.client.llen(keys.history("job")) == 50
    entries = repeat.history("q", "job", 100)
    assert [e.due_ms for e in entries] == [t0 + i for i in range(9_999, 9_949, -1)]
    assert all(e.status in ("succeeded", "failed") for e in entries)


def test_skip_sends_nothing_while_one_is_in_flight(any_repeat: Repeat) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    heard = Heard()
    pumps = [Pump(any_repeat, ["q"], RecordingDispatcher(), listeners=[heard]) for _ in range(3)]
    (first,) = _fire(pumps[0], t0 + 1000)
    assert any_repeat.started(first)
    # Three pumps, three slots: all skipped while the first runs.
    for i, pump in enumerate(pumps):
        assert _fire(pump, t0 + 2000 + 1000 * i) == []
    assert heard.skips == [("job", t0 + 2000), ("job", t0 + 3000), ("job", t0 + 4000)]
    assert any_repeat.finished(first, ok=True)
    (second,) = _fire(pumps[1], t0 + 5000)
    assert second.due_ms == t0 + 5000 and second.previous_due_ms == t0 + 1000
    registration = any_repeat.get("q", "job")
    assert registration is not None
    assert registration.skipped == 3 and registration.inflight == f"job {t0 + 5000}"
    statuses = [(e.due_ms, e.status) for e in any_repeat.history("q", "job")]
    assert statuses == [
        (t0 + 4000, "skipped"),
        (t0 + 3000, "skipped"),
        (t0 + 2000, "skipped"),
        (t0 + 1000, "succeeded"),
    ]


@pytest.mark.parametrize("policy", ["skip", "buffer_one", "replace"])
def test_a_trigger_started_while_a_slot_runs_holds_the_registration_after_that_slot_ends(
    any_repeat: Repeat, policy: str
) -> None:
    # A trigger is sent whatever the policy; once running, it is in flight as a slot is:
    # the slot running beside it ends, and the next slot is still held back by the trigger.
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap=policy, now_ms=t0)
    dispatcher = Revoking()
    pump = Pump(any_repeat, ["q"], dispatcher)
    (slot,) = _fire(pump, t0 + 1000)
    assert any_repeat.started(slot)
    any_repeat.trigger("q", "job", now_ms=t0 + 1200)
    (manual,) = _fire(pump, t0 + 1300)
    assert manual.triggered
    assert any_repeat.started(manual)
    assert any_repeat.finished(slot, ok=True)
    registration = any_repeat.get("q", "job")
    assert registration is not None and registration.inflight == manual.lease_member
    held = _fire(pump, t0 + 2000)
    if policy == "replace":  # sent, and the trigger in flight is revoked, not left running
        assert [o.due_ms for o in held] == [t0 + 2000]
        assert dispatcher.revoked == [manual.id]
    else:  # skipped, or kept for when the trigger ends
        assert held == []
        assert any_repeat.finished(manual, ok=True)
        after = _fire(pump, t0 + 3000)
        expected = [t0 + 2000] if policy == "buffer_one" else [t0 + 3000]
        assert [o.due_ms for o in after] == expected


def test_an_occurrence_in_flight_beside_a_lost_one_takes_its_place(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    heard = Heard()
    pump = Pump(repeat, ["q"], RecordingDispatcher(), listeners=[heard])
    (slot,) = _fire(pump, t0 + 1000)
    repeat.report([report_of("started", slot)], heartbeat_ttl_ms=200)
    repeat.trigger("q", "job", now_ms=t0 + 1100)
    (manual,) = _fire(pump, t0 + 1200)
    repeat.report([report_of("started", manual)], heartbeat_ttl_ms=60_000)
    time.sleep(0.3)  # the slot's worker is silent: it is lost; the trigger's runs on
    now = repeat.server_time_ms()
    assert _fire(pump, now) == []
    assert heard.lost == [("job", t0 + 1000, slot.id)]
    registration = repeat.get("q", "job")
    assert registration is not None and registration.inflight == manual.lease_member
    assert repeat.finished(manual, ok=True)
    assert len(_fire(pump, now + 1000)) == 1


def test_skip_counts_a_sent_but_unstarted_occurrence_as_in_flight(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    assert len(_fire(pump, t0 + 1000)) == 1
    assert _fire(pump, t0 + 2000) == []  # sent, not started yet: still in flight


def test_allow_sends_every_slot(any_repeat: Repeat) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    assert any_repeat.started(first)
    assert [o.due_ms for o in _fire(pump, t0 + 2000)] == [t0 + 2000]


def test_buffer_one_keeps_one_and_sends_it_when_the_running_one_ends(any_repeat: Repeat) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="buffer_one", now_ms=t0)
    heard = Heard()
    pump = Pump(any_repeat, ["q"], RecordingDispatcher(), listeners=[heard])
    (first,) = _fire(pump, t0 + 1000)
    assert any_repeat.started(first)
    assert _fire(pump, t0 + 2000) == []  # kept
    assert _fire(pump, t0 + 3000) == []  # one is kept already: skipped
    assert heard.buffers == [("job", t0 + 2000)] and heard.skips == [("job", t0 + 3000)]
    registration = any_repeat.get("q", "job")
    assert registration is not None and registration.buffered_due_ms == t0 + 2000
    assert any_repeat.finished(first, ok=False, error=RuntimeError("boom"))
    (kept,) = _fire(pump, t0 + 3100)  # released by the finish: sent at once
    assert (kept.due_ms, kept.redelivered, kept.triggered) == (t0 + 2000, False, False)
    assert kept.previous_due_ms == t0 + 1000  # the run before it, not the one before that
    assert _fire(pump, t0 + 3200) == []  # the kept one is in flight now
    registration = any_repeat.get("q", "job")
    assert registration is not None
    assert registration.buffered_due_ms is None and registration.inflight == f"job {t0 + 2000}"
    assert any_repeat.finished(kept, ok=True)
    (after,) = _fire(pump, t0 + 4000)
    assert after.previous_due_ms == t0 + 2000


@pytest.mark.parametrize("paused", ["by hand", "by its failure streak"])
def test_a_paused_buffer_one_schedule_never_sends_its_kept_slot(
    any_repeat: Repeat, paused: str
) -> None:
    t0 = _start(any_repeat)
    streak = 1 if paused == "by its failure streak" else None
    any_repeat.upsert(
        "q", "job", every="1s", template=TEMPLATE, overlap="buffer_one",
        pause_after_failures=streak, now_ms=t0,
    )  # fmt: skip
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    assert any_repeat.started(first)
    assert _fire(pump, t0 + 2000) == []  # kept
    if streak is None:
        any_repeat.pause("q", "job")
        assert any_repeat.finished(first, ok=True)
    else:  # its failure pauses it, in the move that would release the kept slot
        assert any_repeat.finished(first, ok=False, error=RuntimeError("boom"))
    assert _fire(pump, t0 + 3100) == []  # it was sent, though paused
    registration = any_repeat.get("q", "job")
    assert registration is not None and registration.paused
    assert (registration.buffered_due_ms, registration.inflight) == (None, None)
    assert registration.missed == 1  # the kept slot, not sent


def test_a_paused_buffer_one_schedule_whose_run_is_lost_never_sends_its_kept_slot(
    repeat: Repeat,
) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="buffer_one", now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    repeat.report([report_of("started", first)], heartbeat_ttl_ms=200)
    assert _fire(pump, t0 + 2000) == []  # kept
    repeat.pause("q", "job")
    time.sleep(0.3)  # no heartbeat: lost after 200 ms of the server clock
    assert _fire(pump, repeat.server_time_ms()) == []  # the loss released it, though paused
    assert [e.status for e in repeat.history("q", "job") if e.id == first.id] == ["lost"]
    registration = repeat.get("q", "job")
    assert registration is not None and registration.paused
    assert (registration.buffered_due_ms, registration.missed) == (None, 1)


def test_replace_revokes_the_one_in_flight(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="replace", now_ms=t0)
    heard = Heard()
    dispatcher = Revoking()
    pump = Pump(repeat, ["q"], dispatcher, listeners=[heard])
    (first,) = _fire(pump, t0 + 1000)
    assert repeat.started(first)
    (second,) = _fire(pump, t0 + 2000)
    assert dispatcher.revoked == [first.id]
    assert heard.replaced == [(second.id, first.id, True)]
    # A dispatcher that cannot revoke: the new one is sent, and the event says so.
    plain = Pump(repeat, ["q"], RecordingDispatcher(), listeners=[heard])
    (third,) = _fire(plain, t0 + 3000)
    assert heard.replaced[-1] == (third.id, second.id, False)


def test_a_silent_worker_is_lost_and_blocks_nothing(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    heard = Heard()
    pump = Pump(repeat, ["q"], RecordingDispatcher(), listeners=[heard])
    (first,) = _fire(pump, t0 + 1000)
    repeat.report([report_of("started", first)], heartbeat_ttl_ms=200)
    assert _fire(pump, t0 + 2000) == []  # in flight: skipped
    time.sleep(0.3)  # no heartbeat: lost after 200 ms of the server clock
    now = repeat.server_time_ms()
    (second,) = _fire(pump, now)
    assert heard.lost == [("job", t0 + 1000, first.id)]
    assert second.due_ms > t0 + 2000
    lost = [e for e in repeat.history("q", "job") if e.id == first.id]
    assert [e.status for e in lost] == ["lost"]
    registration = repeat.get("q", "job")
    assert registration is not None and registration.lost == 1
    # The worker was only slow: its final report still counts.
    assert repeat.finished(first, ok=True)
    assert [e.status for e in repeat.history("q", "job") if e.id == first.id] == ["succeeded"]


def test_a_lost_occurrence_delivered_again_while_the_next_runs_is_refused_at_its_start(
    repeat: Repeat,
) -> None:
    # The broker requeues a killed worker's message after the pump marked it lost and sent
    # the next slot: `begin` refuses the old one while the new one is in flight.
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    assert first.guarded and repeat.begin(first, heartbeat_ttl_ms=200)
    time.sleep(0.3)  # its worker died: no heartbeat, lost
    (second,) = _fire(pump, repeat.server_time_ms())
    assert repeat.begin(second) and repeat.started(second)
    assert not repeat.begin(first)  # the old one, delivered again: skip it
    # The worker reports the copy it skipped: the history still says the run was lost (a
    # `skipped` with the lost run's start would show a duration nothing ran for).
    assert repeat.report([report_of("skipped", first)]) == 0
    [entry] = [e for e in repeat.history("q", "job") if e.id == first.id]
    assert (entry.status, entry.finished_ms, entry.duration_ms) == ("lost", None, None)
    # A copy of the one in flight, delivered while it is heartbeated, is not run beside it.
    assert repeat.begin_verdict(second) == "running"
    trigger = repeat.trigger("q", "job")
    assert trigger is not None
    (triggered,) = _fire(pump, repeat.server_time_ms())
    assert triggered.triggered and not triggered.guarded and repeat.begin(triggered)
    repeat.finished(second, ok=True)
    assert repeat.begin(first)  # nothing in flight: it may run, and is in flight now
    assert _fire(pump, repeat.server_time_ms() + 1000) == []  # so the claim skips a slot
    # Unguarded registrations never ask (the pump does not mark their occurrences).
    repeat.upsert("q", "free", every="1s", template=TEMPLATE, now_ms=t0)
    assert not any(o.guarded for o in _fire(pump, repeat.server_time_ms() + 2000))


def test_the_same_attempt_started_again_by_another_worker_moves_the_start(
    repeat: Repeat,
) -> None:
    # RabbitMQ gives a dead consumer's unacked message to another worker at once: the same
    # attempt starts again, and its run (duration) is the second one's.
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    (first,) = _fire(Pump(repeat, ["q"], RecordingDispatcher()), t0 + 1000)
    assert repeat.report([report_of("started", first, at_ms=t0 + 1100)]) == 1
    assert repeat.report([report_of("started", first, at_ms=t0 + 4600)]) == 1
    assert repeat.report([report_of("started", first, at_ms=t0 + 1100)]) == 0  # old: nothing
    assert repeat.report([report_of("succeeded", first, at_ms=t0 + 5600)]) == 1
    [entry] = repeat.history("q", "job")
    assert (entry.started_ms, entry.duration_ms) == (t0 + 4600, 1000)
    assert repeat.report([report_of("started", first, at_ms=t0 + 9000)]) == 0  # it ended


def test_begin_says_run_it_with_one_line_when_redis_cannot_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = EmbeddedServer()
    repeat = Repeat(redis.Redis.from_url(server.url, socket_timeout=1), "gone")
    occurrence = report_of("started", {"id": "x", "queue": "q", "name": "n", "due_ms": 1})
    server.stop()
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        assert repeat.begin(
            {"id": occurrence.id, "queue": "q", "name": "n", "due_ms": occurrence.due_ms}
        )
    assert [r.getMessage() for r in caplog.records if "unguarded" in r.getMessage()]


def test_a_retry_waiting_in_the_queue_past_its_countdown_is_not_lost(repeat: Repeat) -> None:
    # Dramatiq re-enqueues a retry; behind busy workers it may wait long after its countdown,
    # as a fresh send waits: it stays in flight for the start timeout, not 3 heartbeats.
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    heard = Heard()
    pump = Pump(repeat, ["q"], RecordingDispatcher(), listeners=[heard])
    (first,) = _fire(pump, t0 + 1000)
    ttl = {"heartbeat_ttl_ms": 200, "start_timeout_ms": 5_000}
    repeat.report([report_of("started", first)], **ttl)
    repeat.report([report_of("retrying", first, error="flaky", hold_ms=100)], **ttl)
    time.sleep(0.5)  # countdown and 2 heartbeat lives passed: the retry is still queued
    assert _fire(pump, repeat.server_time_ms()) == [] and heard.lost == []  # skipped, held
    repeat.report([report_of("started", first, attempt=2)], **ttl)
    [entry] = [e for e in repeat.history("q", "job") if e.id == first.id]
    assert (entry.status, entry.attempt) == ("running", 2)
    time.sleep(0.3)  # once started, heartbeats bound it again: lost after 200 ms of silence
    _fire(pump, repeat.server_time_ms())
    assert heard.lost == [("job", t0 + 1000, first.id)]


def test_heartbeats_keep_a_long_run_in_flight(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    repeat.report([report_of("started", first)], heartbeat_ttl_ms=300)
    for _ in range(4):
        time.sleep(0.15)
        repeat.report([report_of("heartbeat", first)], heartbeat_ttl_ms=300)
    assert _fire(pump, repeat.server_time_ms()) == []
    registration = repeat.get("q", "job")
    assert registration is not None and registration.lost == 0


def test_a_guarded_occurrence_no_worker_starts_is_lost_after_the_start_timeout(
    repeat: Repeat,
) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, overlap="skip", now_ms=t0)
    heard = Heard()
    pump = Pump(repeat, ["q"], RecordingDispatcher(), listeners=[heard], start_timeout_ms=300)
    (first,) = _fire(pump, t0 + 1000)
    assert _fire(pump, t0 + 2000) == []
    time.sleep(0.4)  # on the server's clock: the first never started, so it is lost
    (second,) = _fire(pump, t0 + 3000)
    assert heard.lost == [("job", t0 + 1000, first.id)] and second.due_ms == t0 + 3000


def test_pause_after_failures_pauses_on_the_third_not_before(any_repeat: Repeat) -> None:
    t0 = _start(any_repeat)
    any_repeat.upsert("q", "job", every="1s", template=TEMPLATE, pause_after_failures=3, now_ms=t0)
    pump = Pump(any_repeat, ["q"], RecordingDispatcher())
    for i in range(1, 4):
        (occurrence,) = _fire(pump, t0 + 1000 * i)
        any_repeat.started(occurrence)
        any_repeat.finished(occurrence, ok=False, error=ValueError(f"bad {i}"))
        registration = any_repeat.get("q", "job")
        assert registration is not None
        assert registration.failures == i and registration.paused is (i == 3)
    assert (
        registration.parked_reason == "paused after 3 consecutive failures; last: ValueError: bad 3"
    )
    assert _fire(pump, t0 + 5000) == []
    assert any_repeat.resume("q", "job", now_ms=t0 + 5000)
    registration = any_repeat.get("q", "job")
    assert registration is not None and registration.failures == 0 and not registration.paused


def test_a_success_ends_the_failure_streak(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, pause_after_failures=2, now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    for i, ok in enumerate([False, True, False], start=1):
        (occurrence,) = _fire(pump, t0 + 1000 * i)
        repeat.finished(occurrence, ok=ok, error=None if ok else "E: x")
    registration = repeat.get("q", "job")
    assert registration is not None and registration.failures == 1 and not registration.paused


def test_occurrences_carry_the_previous_run_context(repeat: Repeat) -> None:
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    (first,) = _fire(pump, t0 + 1000)
    assert (first.previous_due_ms, first.last_success_ms) == (None, None)
    repeat.report([report_of("succeeded", first, at_ms=t0 + 1500)])
    (second,) = _fire(pump, t0 + 2000)
    assert (second.previous_due_ms, second.last_success_ms) == (t0 + 1000, t0 + 1500)


def test_the_list_message_is_reported_as_it_is(repeat: Repeat, client: redis.Redis) -> None:
    import json

    from emq_bridge.dispatch import ListPushDispatcher

    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    key = f"{repeat.prefix}:out"
    Pump(repeat, ["q"], ListPushDispatcher(client, key)).run_once(now_ms=t0 + 1000)
    message = json.loads(client.lpop(key) or b"{}")
    assert repeat.started(message) and repeat.finished(message, ok=True)
    (entry,) = repeat.history("q", "job")
    assert (entry.id, entry.status, entry.released_ms) == (message["id"], "succeeded", t0 + 1000)
    assert repeat.started({"queue": "q"}) is False  # not a message: one log line, no raise


def test_policies_are_checked_before_anything_is_written(repeat: Repeat) -> None:
    for bad in (
        {"overlap": "sometimes"},
        {"pause_after_failures": 0},
        {"pause_after_failures": True},
    ):
        with pytest.raises(ScheduleError):
            repeat.upsert("q", "job", every="1s", template=TEMPLATE, **bad)  # type: ignore[arg-type]
    assert repeat.client.keys(f"{repeat.prefix}:*") == []


def test_default_policies_keep_the_digest_of_older_records(repeat: Repeat) -> None:
    from emq_bridge.definition import define

    plain = define(every="1s", template=TEMPLATE)
    assert "overlap" not in plain.to_fields() and "pause_after_failures" not in plain.to_fields()
    assert define(every="1s", template=TEMPLATE, overlap="allow").digest == plain.digest
    assert define(every="1s", template=TEMPLATE, overlap="skip").digest != plain.digest


def test_error_text_is_one_bounded_line() -> None:
    line = error_text(ValueError("a\nb " + "x" * 1000))
    assert line.startswith("ValueError: a b x") and "\n" not in line
    assert len(line) == MAX_ERROR_CHARS


def test_error_text_of_a_dramatiq_error_with_no_message_is_its_type() -> None:
    from dramatiq.errors import Retry

    assert error_text(Retry()) == "Retry"
    assert error_text(Retry("again later")) == "Retry: again later"
    assert error_text(ValueError("''")) == "ValueError: ''"  # a message of two quotes stays


@pytest.fixture
def lone_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


def test_the_reporter_drops_reports_with_one_line_when_redis_is_gone(
    lone_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Repeat(redis.Redis.from_url(lone_server.url, socket_timeout=1), "lone")
    t0 = _start(repeat)
    repeat.upsert("q", "job", every="1s", template=TEMPLATE, now_ms=t0)
    (occurrence,) = _fire(Pump(repeat, ["q"], RecordingDispatcher()), t0 + 1000)
    reporter = Reporter(repeat, heartbeat_s=0.2)
    reporter.report(report_of("started", occurrence))
    assert reporter.flush(5)
    lone_server.stop()
    caplog.set_level(logging.INFO, logger="emq_bridge.reporting")
    started = time.monotonic()
    for attempt in range(2, 50):
        reporter.report(report_of("started", occurrence, attempt=attempt))  # never raises
    assert time.monotonic() - started < 0.5  # queued, not sent on the caller's thread
    assert reporter.flush(10)
    time.sleep(0.5)  # heartbeats fail too, silently
    drops = [r for r in caplog.records if "dropped until Redis" in r.getMessage()]
    assert len(drops) == 1
    reporter.close()


def test_a_start_builds_its_end_and_folds_into_it() -> None:
    """`Report.ended` is the same occurrence and attempt at another time (what the adapters
    send at the end from the start they built); `folded` carries the start in the final."""
    start = Report("started", "q", "job", "id-1", 1_000, 1_100, 2, released_ms=1_001)
    end = start.ended("failed", 1_400, "OSError: flaky", hold_ms=5)
    assert (end.kind, end.at_ms, end.error, end.hold_ms) == ("failed", 1_400, "OSError: flaky", 5)
    assert (end.queue, end.name, end.id, end.due_ms, end.attempt) == ("q", "job", "id-1", 1_000, 2)
    assert end.released_ms == 1_001 and end.started_ms is None  # the start is its own report
    # A start not sent yet: the final carries it (`Reporter.finish`).
    only = start.ended("failed", 1_400, "OSError: flaky", hold_ms=5, started_ms=1_100)
    assert (only.kind, only.started_ms, only.released_ms) == ("failed", 1_100, 1_001)
    plain = Report("succeeded", "q", "job", "id-1", 1_000, 1_500, 2)
    assert plain.folded(start).started_ms == 1_100
    assert plain.folded(start).released_ms == 1_001  # the final had none: the start's
    folded = end.folded(start)
    assert (folded.kind, folded.error, folded.hold_ms, folded.at_ms, folded.started_ms) == (
        "failed",
        "OSError: flaky",
        5,
        1_400,
        1_100,
    )
