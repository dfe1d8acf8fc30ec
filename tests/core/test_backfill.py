"""Backfill: every past slot sent once, with the id the live schedule gives it, rate-limited,
marked as a backfill; overlapping live firing (3 pumps) and other backfills, nothing twice."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from quiet import quiet_offset

from emq_bridge import Pump, Repeat, ScheduleError, occurrence_id
from emq_bridge.celery.dispatch import BACKFILL_HEADER, occurrence_headers
from emq_bridge.cli import cli
from emq_bridge.definition import define
from emq_bridge.dispatch import occurrence_message
from emq_bridge.occurrence import Occurrence
from emq_bridge.testing import RecordingDispatcher

UTC = timezone.utc
S = 1000
T0 = int(datetime(2026, 6, 1, tzinfo=UTC).timestamp() * 1000)
TEMPLATE = {"task": "t"}


def test_a_backfill_overlapping_live_firing_of_three_pumps_and_an_outage_sends_every_slot_once(
    redis_url: str, prefix: str
) -> None:
    setup = Repeat(redis.Redis.from_url(redis_url), prefix)
    setup.upsert("q", "tick", definition=define(every="10s", template=TEMPLATE), now_ms=T0)
    recorder = RecordingDispatcher()
    pumps = [
        Pump(Repeat(redis.Redis.from_url(redis_url), prefix), ["q"], recorder, batch_size=3)
        for _ in range(3)
    ]
    backfiller = Repeat(redis.Redis.from_url(redis_url), prefix)
    backfills: list[Any] = []

    def backfill(start: int, end: int, now: int) -> None:
        backfills.append(backfiller.backfill("q", "tick", start, end, rate=0, now_ms=now))

    with ThreadPoolExecutor(5) as pool:
        for second in range(1, 301):
            now = T0 + second * S
            if 100 < second < 160:
                continue  # an outage: no pump runs, the misfire policy drops slots
            calls = [pool.submit(pump.run_once, now) for pump in pumps]
            if second == 200:  # the range reaches the live frontier, while the pumps fire
                calls.append(pool.submit(backfill, T0 - 100 * S, T0 + 200 * S, now))
            if second == 230:  # a second backfill overlapping the first and live slots
                calls.append(pool.submit(backfill, T0 + 50 * S, T0 + 225 * S, now))
            for call in calls:
                call.result()
    expected = list(range(T0 - 100 * S, T0 + 301 * S, 10 * S))
    dues = sorted(o.due_ms for o in recorder.occurrences)
    assert dues == expected  # every slot once: none lost, none twice
    assert not any(o.redelivered for o in recorder.occurrences)
    for occurrence in recorder.occurrences:
        assert occurrence.id == occurrence_id(prefix, "q", "tick", occurrence.due_ms)
    backfilled = sorted(o.due_ms for o in recorder.occurrences if o.backfill)
    live = sorted(o.due_ms for o in recorder.occurrences if not o.backfill)
    assert backfilled[:11] == list(range(T0 - 100 * S, T0 + 1, 10 * S))  # before it existed
    assert any(T0 + 100 * S < d < T0 + 160 * S for d in backfilled)  # dropped in the outage
    assert all(d > T0 for d in live)
    first, second = backfills
    assert first.queued == backfilled
    assert second.queued == [] and second.done + second.live == 18
    assert setup.leases("q") == []


def test_a_dry_run_decides_and_writes_nothing(repeat: Repeat) -> None:
    repeat.upsert("q", "h", definition=define(every="1h", template=TEMPLATE), now_ms=T0)
    before = sorted(repeat.client.keys(f"{repeat.prefix}:*"))
    dry = repeat.backfill("q", "h", T0 - 5 * 3_600_000, T0, dry_run=True, now_ms=T0 + S)
    assert dry.dry_run and len(dry.queued) == 6
    assert sorted(repeat.client.keys(f"{repeat.prefix}:*")) == before
    assert repeat.leases("q") == []
    real = repeat.backfill("q", "h", T0 - 5 * 3_600_000, T0, now_ms=T0 + S)
    assert real.queued == dry.queued
    assert repeat.backfill("q", "h", T0 - 5 * 3_600_000, T0, now_ms=T0 + S).done == 6


def test_a_backfill_is_rate_limited_and_marked_on_every_message(repeat: Repeat) -> None:
    repeat.upsert("q", "m", definition=define(every="1m", template=TEMPLATE), now_ms=T0)
    result = repeat.backfill("q", "m", T0 - 9 * 60 * S, T0, rate=2, now_ms=T0 + S)
    assert len(result.queued) == 10 and result.spacing_ms == 500
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once(T0 + S)
    assert len(recorder.occurrences) == 1
    pump.run_once(T0 + 3 * S)
    assert len(recorder.occurrences) == 5
    pump.run_once(T0 + 10 * S)
    assert [o.due_ms for o in recorder.occurrences] == result.queued
    occurrence = recorder.occurrences[0]
    assert occurrence.backfill and not occurrence.triggered and not occurrence.redelivered
    assert occurrence_headers(occurrence)[BACKFILL_HEADER] is True
    assert occurrence_message(occurrence)["backfill"] is True
    live = Occurrence("q", "m", T0, "id", {}, T0)
    assert occurrence_headers(live)[BACKFILL_HEADER] is False


class FailOnce(RecordingDispatcher):
    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def dispatch(self, occurrence: Occurrence) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionError("broker down")
        super().dispatch(occurrence)


def test_a_backfilled_slot_whose_send_failed_is_sent_again_with_its_id_and_mark(
    repeat: Repeat,
) -> None:
    repeat.upsert("q", "d", definition=define(every="1d", template=TEMPLATE), now_ms=T0)
    result = repeat.backfill("q", "d", T0 - 86_400_000, T0 - 86_400_000, now_ms=T0)
    assert result.queued == [T0 - 86_400_000]
    dispatcher = FailOnce()
    pump = Pump(repeat, ["q"], dispatcher, lease_ms=5 * S)
    pump.run_once(T0 + S)
    assert dispatcher.occurrences == []
    pump.run_once(T0 + 7 * S)  # the lease expired: re-sent
    (again,) = dispatcher.occurrences
    assert again.backfill and again.redelivered
    assert again.id == occurrence_id(repeat.prefix, "q", "d", T0 - 86_400_000)


def test_a_jittered_registration_is_backfilled_on_its_nominal_slots(repeat: Repeat) -> None:
    repeat.upsert(
        "q", "j", definition=define(every="1h", jitter="10m", template=TEMPLATE), now_ms=T0
    )
    result = repeat.backfill("q", "j", T0 - 3 * 3_600_000, T0, now_ms=T0 + S)
    assert result.queued == [T0 - h * 3_600_000 for h in (3, 2, 1, 0)]


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (T0, T0 - S, "ends before it starts"),
        (T0, T0 + 3_600_000, "in the future"),
        ("yesterday", T0, "ISO 8601"),
    ],
)
def test_a_bad_range_is_refused_and_nothing_is_written(
    start: Any, end: Any, message: str, repeat: Repeat
) -> None:
    repeat.upsert("q", "h", definition=define(every="1h", template=TEMPLATE), now_ms=T0)
    with pytest.raises(ScheduleError, match=message):
        repeat.backfill("q", "h", start, end, now_ms=T0 + S)
    assert repeat.leases("q") == []
    with pytest.raises(KeyError):
        repeat.backfill("q", "nope", T0 - 3_600_000, T0, now_ms=T0 + S)


def test_the_cli_backfills_dry_runs_and_refuses_bad_input(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    now = datetime.now(UTC)
    repeat.upsert("q", "tm", definition=define(every="10m", template=TEMPLATE))
    base = ["--redis-url", redis_url, "--prefix", prefix, "backfill", "q", "tm"]
    start = (now - timedelta(hours=1)).isoformat()
    end = (now - timedelta(minutes=1)).isoformat()
    dry = CliRunner().invoke(cli, [*base, "--from", start, "--to", end, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("would queue 6 slot(s) of q/tm") or "would queue 5" in dry.output
    assert repeat.leases("q") == []
    done = CliRunner().invoke(cli, [*base, "--from", start, "--to", end, "--json"])
    assert done.exit_code == 0, done.output
    queued = json.loads(done.output)["queued_ms"]
    assert len(queued) in (5, 6) and len(repeat.leases("q")) == len(queued)
    again = CliRunner().invoke(cli, [*base, "--from", start, "--to", end, "--json"])
    assert json.loads(again.output)["queued_ms"] == [] and json.loads(again.output)["done"]
    future = (now + timedelta(hours=1)).isoformat()
    for args in (["--from", end, "--to", start], ["--from", start, "--to", future]):
        bad = CliRunner().invoke(cli, [*base, *args])
        assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1, bad.output
    missing = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "backfill",
            "q",
            "nope",
            "--from",
            start,
            "--to",
            end,
        ],
    )
    assert missing.exit_code == 1 and "no registration" in missing.output


def test_cancel_removes_the_backfill_ledger_and_the_queued_slots(repeat: Repeat) -> None:
    repeat.upsert("q", "c", definition=define(every="1h", template=TEMPLATE), now_ms=T0)
    repeat.backfill("q", "c", T0 - 3 * 3_600_000, T0, rate=1, now_ms=T0 + S)
    ledger = repeat.keys("q").backfilled("c")
    assert repeat.client.zcard(ledger) == 4 and len(repeat.leases("q")) == 4
    assert repeat.cancel("q", "c")
    assert not repeat.client.exists(ledger) and repeat.leases("q") == []


def test_a_real_dramatiq_worker_sees_the_backfilled_slot_with_its_live_id(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    import threading

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import CurrentMessage

    from emq_bridge.dramatiq.dispatch import DramatiqDispatcher
    from emq_bridge.dramatiq.schedule import occurrence_of

    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-worker")
    broker.add_middleware(CurrentMessage())
    seen: list[Any] = []
    done = threading.Event()

    @dramatiq.actor(broker=broker, actor_name="bf_task", queue_name="bfq")
    def bf_task() -> None:
        seen.append(occurrence_of(CurrentMessage.get_current_message()))
        done.set()

    # The day's slot far from now: a midnight before the pump would send it as well.
    nightly = define(every="1d", offset=quiet_offset("1d"), template={"task": "bf_task"})
    repeat.upsert("bfq", "nightly", definition=nightly)
    now = repeat.server_time_ms()
    day = 86_400_000
    slot = nightly.cadence.next_after(now - 3 * day)  # a slot of its grid, two days back
    assert repeat.backfill("bfq", "nightly", slot, slot).queued == [slot]
    Pump(repeat, ["bfq"], DramatiqDispatcher(broker)).run_once()
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        assert done.wait(20), "the worker never ran the backfilled message"
    finally:
        worker.stop()
        broker.close()
    (info,) = seen
    assert info.backfill and not info.triggered and info.due_ms == slot
    assert info.id == occurrence_id(prefix, "bfq", "nightly", slot)


H = 3_600_000


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def test_a_backfill_sends_no_slot_after_the_end_of_a_completed_schedule(repeat: Repeat) -> None:
    # The tester's case: a schedule ended at 12:00 (completed), then a backfill of 13:00-14:00.
    repeat.upsert(
        "q",
        "ended",
        definition=define(every="1h", end_at=at(T0 + 12 * H), template=TEMPLATE),
        now_ms=T0 + 9 * H,
    )
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    for hour in range(10, 15):
        pump.run_once(T0 + hour * H)
    registration = repeat.get("q", "ended")
    assert registration is not None and registration.completed == "end_at"
    fired = [o.due_ms for o in recorder.occurrences]
    assert fired == [T0 + h * H for h in (10, 11, 12)]
    dry = repeat.backfill("q", "ended", T0 + 13 * H, T0 + 14 * H, dry_run=True, now_ms=T0 + 15 * H)
    assert dry.queued == [] and dry.outside == 2
    done = repeat.backfill("q", "ended", T0 + 9 * H, T0 + 14 * H, rate=0, now_ms=T0 + 15 * H)
    assert done.queued == [T0 + 9 * H] and done.outside == 2 and done.live == 3
    pump.run_once(T0 + 16 * H)
    assert [o.due_ms for o in recorder.occurrences if o.backfill] == [T0 + 9 * H]


def test_a_backfill_sends_no_slot_before_start_at(repeat: Repeat) -> None:
    repeat.upsert(
        "q",
        "later",
        definition=define(every="1h", start_at=at(T0 + 12 * H), template=TEMPLATE),
        now_ms=T0,
    )
    dry = repeat.backfill("q", "later", T0 + 9 * H, T0 + 11 * H, dry_run=True, now_ms=T0 + 11 * H)
    assert dry.queued == [] and dry.outside == 3
    done = repeat.backfill("q", "later", T0 + 9 * H, T0 + 11 * H, now_ms=T0 + 11 * H)
    assert done.queued == [] and repeat.leases("q") == []


def test_the_bounds_are_decided_in_lua_from_the_record_as_it_is(repeat: Repeat) -> None:
    # What a caller that read the record before its bounds changed would send: every slot
    # of 09:00-14:00 with the score it read. The script reads start_ms and end_ms itself.
    repeat.upsert(
        "q",
        "b",
        definition=define(
            every="1h", start_at=at(T0 + 10 * H), end_at=at(T0 + 12 * H), template=TEMPLATE
        ),
        now_ms=T0,
    )
    keys = repeat.keys("q")
    score = repeat.client.zscore(keys.registry, "b")
    slots = [str(T0 + h * H) for h in range(9, 15)]
    reply = repeat.scripts.backfill(
        keys=[keys.registry, keys.record("b"), keys.leases, keys.backfilled("b")],
        args=["b", str(int(score)), "", "", json.dumps(slots), T0, 0, "", keys.wake_channel],
    )
    assert json.loads(reply[1]) == [str(T0 + h * H) for h in (10, 11, 12)]
    assert int(reply[5]) == 3  # 09:00, 13:00 and 14:00: outside
    # A one-off: only its instants are slots, whatever the caller sends.
    repeat.upsert(
        "q",
        "once",
        definition=define(at=[at(T0 + H), at(T0 + 3 * H)], template=TEMPLATE),
        now_ms=T0 + 4 * H,
    )
    one = [str(T0 + h * H) for h in (1, 2, 3)]
    score = repeat.client.zscore(keys.registry, "once")
    reply = repeat.scripts.backfill(
        keys=[keys.registry, keys.record("once"), keys.leases, keys.backfilled("once")],
        args=["once", "inf", "", "", json.dumps(one), T0, 0, "1", keys.wake_channel],
    )
    assert score == float("inf")
    assert json.loads(reply[1]) == [str(T0 + H), str(T0 + 3 * H)] and int(reply[5]) == 1


def test_a_one_off_is_backfilled_on_its_instants_only(repeat: Repeat) -> None:
    # Created after its first instant: that instant did not fire, a backfill may send it.
    repeat.upsert(
        "q",
        "once",
        definition=define(at=[at(T0 - 2 * H), at(T0 + H)], template=TEMPLATE),
        now_ms=T0,
    )
    done = repeat.backfill("q", "once", T0 - 5 * H, T0, rate=0, now_ms=T0 + S)
    assert done.queued == [T0 - 2 * H] and done.outside == 0


def test_a_schedule_with_a_limit_is_not_backfilled(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    repeat.upsert("q", "lim", definition=define(every="1h", limit=3, template=TEMPLATE), now_ms=T0)
    with pytest.raises(ScheduleError, match="limit"):
        repeat.backfill("q", "lim", T0 - 5 * H, T0, now_ms=T0 + S)
    assert repeat.leases("q") == []
    keys = repeat.keys("q")
    score = repeat.client.zscore(keys.registry, "lim")
    reply = repeat.scripts.backfill(  # the script refuses it too (a limit added after a read)
        keys=[keys.registry, keys.record("lim"), keys.leases, keys.backfilled("lim")],
        args=["lim", str(int(score)), "", "", json.dumps([str(T0 - H)]), T0, 0, "", "w"],
    )
    assert reply == -3 and repeat.leases("q") == []
    now = datetime.now(UTC)
    bad = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "backfill",
            "q",
            "lim",
            "--from",
            (now - timedelta(hours=3)).isoformat(),
            "--to",
            now.isoformat(),
        ],
    )
    assert bad.exit_code == 1 and "limit" in bad.output, bad.output


@pytest.mark.parametrize("rate", [1e-300, 1e-6, float("nan"), float("inf"), -1, 2e6])
def test_a_rate_whose_spacing_is_not_sane_is_refused(rate: float, repeat: Repeat) -> None:
    repeat.upsert("q", "r", definition=define(every="1h", template=TEMPLATE), now_ms=T0)
    with pytest.raises(ScheduleError, match="rate must be"):
        repeat.backfill("q", "r", T0 - 5 * H, T0, rate=rate, now_ms=T0 + S)
    assert repeat.leases("q") == []


def test_the_slowest_rate_spaces_slots_a_day_apart(repeat: Repeat) -> None:
    repeat.upsert("q", "r", definition=define(every="1h", template=TEMPLATE), now_ms=T0)
    done = repeat.backfill("q", "r", T0 - 2 * H, T0, rate=1 / 86_400, now_ms=T0 + S)
    assert done.spacing_ms == 86_400_000 and len(done.queued) == 3
    scores = sorted(
        score for _, score in repeat.client.zrange(repeat.keys("q").leases, 0, -1, withscores=True)
    )
    assert scores == [T0 + S + k * 86_400_000 for k in range(3)]


@pytest.mark.parametrize("rate", ["1e-300", "0.00001", "nan", "-1"])
def test_the_cli_refuses_a_bad_rate_as_bad_usage_in_one_line(
    rate: str, repeat: Repeat, redis_url: str, prefix: str
) -> None:
    repeat.upsert("q", "r", definition=define(every="1h", template=TEMPLATE))
    now = datetime.now(UTC)
    result = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "backfill",
            "q",
            "r",
            "--from",
            (now - timedelta(hours=3)).isoformat(),
            "--to",
            now.isoformat(),
            "--rate",
            rate,
        ],
    )
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "--rate" in result.output
    assert repeat.leases("q") == []


def test_the_cli_says_what_sends_the_slots_left_to_a_paused_schedule(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    # Before: "N left to the live schedule", which a plain resume never sends.
    import time

    repeat.upsert("q", "p", definition=define(every="1s", template=TEMPLATE))
    paused_at = datetime.now(UTC)
    repeat.pause("q", "p")
    time.sleep(2.5)  # slots pass while it is paused
    base = ["--redis-url", redis_url, "--prefix", prefix, "backfill", "q", "p"]
    window = ["--from", paused_at.isoformat(), "--to", datetime.now(UTC).isoformat()]
    done = CliRunner().invoke(cli, [*base, *window, "--dry-run"])
    assert done.exit_code == 0, done.output
    first = done.output.splitlines()[0]
    assert " 0 left to the live schedule" not in first, first
    assert "it is paused: `resume --catchup` hands them to its misfire policy" in first, first


def test_the_ledger_keeps_every_backfilled_slot_after_it_is_sent_at_about_100_bytes_a_slot(
    repeat: Repeat,
) -> None:
    # docs/design.md and docs/cron.md: the ledger keeps every slot for the registration's
    # life (forgetting one would let a later backfill send it again), about 80 to 100 B a
    # slot (measured by a probe in session 29: 7.5 MB for 100,000).
    repeat.upsert("q", "m", definition=define(every="1m", template=TEMPLATE), now_ms=T0)
    slots = 2_000
    repeat.backfill("q", "m", T0 - slots * 60 * S, T0 - 60 * S, rate=0, now_ms=T0 + S)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, batch_size=500)
    while pump.run_once(T0 + 2 * S).dispatched:
        pass
    assert sum(o.backfill for o in recorder.occurrences) == slots
    ledger = repeat.keys("q").backfilled("m")
    assert repeat.client.zcard(ledger) == slots  # sent, and kept
    per_slot = int(repeat.client.memory_usage(ledger, samples=0) or 0) / slots
    assert 40 <= per_slot <= 120, per_slot  # about 80 on Valkey 9, 100 on Redis 7.0 and 6.2
    again = repeat.backfill("q", "m", T0 - slots * 60 * S, T0 - 60 * S, rate=0, now_ms=T0 + 3 * S)
    assert again.queued == []  # none twice
