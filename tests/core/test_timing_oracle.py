"""Aligned intervals, bounds and one-offs against oracles that know nothing of the code.

* Interval slots: walk the epoch from 0 by whole intervals (integer additions, no modulo).
* Instants of zoned wall times: walk UTC minutes and keep those whose local wall time
  (zoneinfo's UTC -> local, the direction that has no ambiguity) is the one asked for; the
  `fold`-th of them.
* Cron slots: tests/core/cron_oracle.py (a brute-force walk of wall-clock time).

Each case registers at an instant that is not on the grid, drives a pump with a
`ManualClock` through the window in steps shorter than the interval, and compares what fired
with the oracle's list; then checks the registration is `completed` when it should be.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from cron_oracle import Oracle

from emq_bridge import Pump, Repeat
from emq_bridge.errors import ScheduleError
from emq_bridge.testing import ManualClock, RecordingDispatcher

MIN = 60_000
TEMPLATE = {"task": "t"}
UTC = timezone.utc


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def grid_oracle(every_ms: int, offset_ms: int, low: int, high: int) -> list[int]:
    """Slots `offset + k * every` in [low, high], found by walking from the epoch."""
    slot, out = offset_ms, []
    step = every_ms
    # Walk in big strides first (still only additions), then slot by slot.
    while slot + step * 1024 < low:
        slot += step * 1024
    while slot <= high:
        if slot >= low:
            out.append(slot)
        slot += step
    return out


def wall_instant(wall: datetime, zone: str, fold: int = 0) -> int:
    """The epoch ms at which `zone`'s clocks show `wall` (naive), the `fold`-th time."""
    tz = ZoneInfo(zone)
    probe = datetime(wall.year, wall.month, wall.day, tzinfo=UTC) - timedelta(days=1)
    hits = []
    for _ in range(3 * 24 * 60):
        if probe.astimezone(tz).replace(tzinfo=None) == wall:
            hits.append(ms(probe))
        probe += timedelta(minutes=1)
    assert hits, f"{wall} does not exist in {zone}"
    return hits[min(fold, len(hits) - 1)]


def drive(repeat: Repeat, clock: ManualClock, until: int, step_ms: int) -> list[int]:
    """Pump queue `q` from the clock's now past `until` (the clock ends on the last tick's
    time); return the nominal times fired."""
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    while clock() <= until:
        pump.run_once()
        clock.advance(step_ms)
    pump.run_once()
    return sorted(o.due_ms for o in recorder.occurrences if not o.triggered)


# -- aligned intervals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "offset", "every_ms", "offset_ms"),
    [
        ("15m", None, 15 * MIN, 0),
        ("15m", "5m", 15 * MIN, 5 * MIN),
        ("7m", None, 7 * MIN, 0),  # does not divide a day: the epoch's grid, not midnight's
        ("5h", "30m", 300 * MIN, 30 * MIN),
        (90, 1.5, 90_000, 1500),
    ],
)
def test_an_interval_fires_on_the_epoch_grid_whenever_it_was_registered(
    repeat: Repeat, every: object, offset: object, every_ms: int, offset_ms: int
) -> None:
    registered = datetime(2030, 1, 1, 10, 7, 23, 417_000, tzinfo=UTC)  # on no grid
    clock = ManualClock(registered)
    repeat.register("q", "job", every=every, offset=offset, template=TEMPLATE, now_ms=clock())
    fired = drive(repeat, clock, clock() + 12 * every_ms, every_ms // 3)
    assert len(fired) >= 12
    assert fired == grid_oracle(every_ms, offset_ms, ms(registered) + 1, clock())


def test_a_fifteen_minute_job_registered_off_the_quarter_fires_at_00_15_30_45(
    repeat: Repeat,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC))
    repeat.register("q", "job", every="15m", template=TEMPLATE, now_ms=clock())
    fired = drive(repeat, clock, clock() + 60 * MIN, 4 * MIN)
    times = [datetime.fromtimestamp(t / 1000, UTC).strftime("%H:%M:%S") for t in fired]
    assert times == ["10:15:00", "10:30:00", "10:45:00", "11:00:00"]


def test_release_keeps_echomq_now_plus_every(repeat: Repeat) -> None:
    start = datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC)
    clock = ManualClock(start)
    repeat.register("q", "job", every="15m", anchor="release", template=TEMPLATE, now_ms=clock())
    assert repeat.next_runs("q", "job", 1) == [ms(start) + 15 * MIN]


def test_changing_the_interval_keeps_the_grid_and_does_not_reanchor_on_the_sync(
    repeat: Repeat,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC))
    repeat.upsert("q", "job", every="15m", template=TEMPLATE, now_ms=clock())
    assert drive(repeat, clock, ms(datetime(2030, 1, 1, 10, 21, tzinfo=UTC)), MIN)[-1] == ms(
        datetime(2030, 1, 1, 10, 15, tzinfo=UTC)
    )
    assert repeat.upsert("q", "job", every="10m", template=TEMPLATE, now_ms=clock()) == "updated"
    assert repeat.next_runs("q", "job", 2) == [
        ms(datetime(2030, 1, 1, 10, 30, tzinfo=UTC)),
        ms(datetime(2030, 1, 1, 10, 40, tzinfo=UTC)),
    ]


def test_immediately_fires_once_at_registration_then_on_the_grid(repeat: Repeat) -> None:
    registered = datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC)
    clock = ManualClock(registered)
    kwargs = {"every": "15m", "immediately": True, "template": TEMPLATE}
    assert repeat.upsert("q", "job", **kwargs, now_ms=clock()) == "created"  # type: ignore[arg-type]
    fired = drive(repeat, clock, clock() + 40 * MIN, 2 * MIN)
    # A re-sync and a cadence change never fire "immediately" again.
    assert repeat.upsert("q", "job", **kwargs, now_ms=clock()) == "unchanged"  # type: ignore[arg-type]
    repeat.upsert("q", "job", every="10m", immediately=True, template=TEMPLATE, now_ms=clock())
    fired += drive(repeat, clock, clock() + 25 * MIN, 2 * MIN)
    at = [datetime.fromtimestamp(t / 1000, UTC).strftime("%H:%M:%S") for t in fired]
    assert at == [
        *("10:07:23", "10:15:00", "10:30:00", "10:45:00"),  # 15m, changed at 10:49:23
        *("10:50:00", "11:00:00", "11:10:00"),  # 10m: on its grid, not 10:59:23
    ]


def test_a_record_written_before_the_grid_keeps_its_phase_until_its_declaration_syncs(
    repeat: Repeat, client: object
) -> None:
    registered = datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC)
    clock = ManualClock(registered)
    # What version 1 wrote for `every="15m"`: anchor=schedule, the registration's phase.
    repeat.upsert("q", "job", every="15m", anchor="schedule", template=TEMPLATE, now_ms=clock())
    assert repeat.next_runs("q", "job", 2) == [ms(registered) + 15 * MIN, ms(registered) + 30 * MIN]
    fired = drive(repeat, clock, ms(registered) + 16 * MIN, MIN)
    assert fired == [ms(registered) + 15 * MIN]
    # The new version's declaration (the grid default) differs: one update, onto the grid,
    # at its first slot an interval or more after the last run (10:22:23): 10:45, not 10:30.
    assert repeat.upsert("q", "job", every="15m", template=TEMPLATE, now_ms=clock()) == "updated"
    assert repeat.next_runs("q", "job", 1) == [ms(datetime(2030, 1, 1, 10, 45, tzinfo=UTC))]


def test_offset_and_anchor_errors_are_clear() -> None:
    from emq_bridge import define

    with pytest.raises(ScheduleError, match="offset needs anchor='grid'"):
        define(every="15m", offset="5m", anchor="release")
    with pytest.raises(ScheduleError, match="less than the interval"):
        define(every="15m", offset="15m")
    with pytest.raises(ScheduleError, match="interval schedules"):
        define(cron="0 9 * * *", offset="5m")
    # A datetime offset: the grid passes through it.
    on = define(every="1h", offset=datetime(2030, 1, 1, 0, 20, tzinfo=UTC))
    assert on.to_fields()["offset_ms"] == str(20 * MIN)


# -- bounds across DST, in zones with and without recent rule changes -------------------

# (zone, start wall, fold, end wall, fold, cron): start and end sit on or next to transitions.
ZONED = [
    # Paris spring-forward (02:00 -> 03:00, 2026-03-29) and fall-back (03:00 -> 02:00, 10-25).
    ("Europe/Paris", (2026, 3, 28, 23, 10), 0, (2026, 3, 29, 4, 20), 0, "*/20 * * * *"),
    ("Europe/Paris", (2026, 10, 25, 2, 30), 1, (2026, 10, 25, 5, 0), 0, "30 2 * * *"),
    ("Europe/Paris", (2026, 10, 25, 2, 10), 0, (2026, 10, 25, 2, 40), 1, "*/15 * * * *"),
    # New York: 2026-03-08 02:00 -> 03:00, 2026-11-01 02:00 -> 01:00.
    ("America/New_York", (2026, 3, 8, 0, 5), 0, (2026, 3, 8, 5, 0), 0, "0 * * * *"),
    ("America/New_York", (2026, 11, 1, 1, 20), 1, (2026, 11, 1, 3, 0), 0, "*/30 * * * *"),
    # Lord Howe: a 30-minute shift, 2026-04-05 02:00 -> 01:30, 2026-10-04 02:00 -> 02:30.
    ("Australia/Lord_Howe", (2026, 4, 5, 1, 40), 1, (2026, 4, 5, 3, 0), 0, "*/10 * * * *"),
    ("Australia/Lord_Howe", (2026, 10, 4, 1, 0), 0, (2026, 10, 4, 4, 0), 0, "45 2 * * *"),
    # Mexico City abolished DST in 2022: its last fall-back, 2022-10-30 02:00 -> 01:00.
    ("America/Mexico_City", (2022, 10, 30, 1, 15), 0, (2022, 10, 30, 1, 45), 1, "*/15 * * * *"),
    # Ciudad Juarez left Mexico City's rules in 2022 and follows the US since.
    ("America/Ciudad_Juarez", (2023, 3, 12, 1, 0), 0, (2023, 3, 12, 4, 0), 0, "*/30 * * * *"),
]


@pytest.mark.parametrize(("zone", "start", "start_fold", "end", "end_fold", "cron"), ZONED)
def test_zoned_start_and_end_bound_an_interval_and_a_cron_exactly(
    repeat: Repeat,
    zone: str,
    start: tuple[int, ...],
    start_fold: int,
    end: tuple[int, ...],
    end_fold: int,
    cron: str,
) -> None:
    tz = ZoneInfo(zone)
    start_at = datetime(*start, tzinfo=tz, fold=start_fold)
    end_at = datetime(*end, tzinfo=tz, fold=end_fold)
    low = wall_instant(datetime(*start), zone, start_fold)
    high = wall_instant(datetime(*end), zone, end_fold)
    clock = ManualClock(low - 95 * MIN - 17_000)
    bounds = {"start_at": start_at, "end_at": end_at, "template": TEMPLATE, "now_ms": clock()}
    repeat.register("q", "every", every="10m", **bounds)  # type: ignore[arg-type]
    repeat.register("q", "cron", cron=cron, tz=zone, **bounds)  # type: ignore[arg-type]
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    while clock() <= high + 2 * 3_600_000:
        pump.run_once()
        clock.advance(3 * MIN)
    fired = {
        name: sorted(o.due_ms for o in recorder.occurrences if o.name == name)
        for name in ("every", "cron")
    }
    assert fired["every"] == grid_oracle(10 * MIN, 0, low, high)
    window = Oracle(cron, zone).fires(
        datetime.fromtimestamp((low - 1) / 1000, UTC) - timedelta(seconds=59),
        datetime.fromtimestamp(high / 1000 + 3 * 3600, UTC),
    )
    assert fired["cron"] == [t for t in window if low <= t <= high]
    for registration in repeat.list("q"):
        assert registration.completed == "end_at"
        assert registration.next_run_ms is None
        assert registration.upcoming(3) == []


def test_a_wall_time_that_does_not_exist_is_refused() -> None:
    from emq_bridge import define

    with pytest.raises(ScheduleError, match="does not exist"):
        define(every="1h", start_at=datetime(2026, 3, 29, 2, 30, tzinfo=ZoneInfo("Europe/Paris")))
    with pytest.raises(ScheduleError, match="no time zone"):
        define(every="1h", end_at=datetime(2026, 3, 29, 2, 30))
    with pytest.raises(ScheduleError, match="before start_at"):
        define(every="1h", start_at="2026-01-02T00:00:00Z", end_at="2026-01-01T00:00:00Z")


def test_a_start_in_the_future_waits_and_an_end_in_the_past_completes_at_once(
    repeat: Repeat,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC))
    repeat.register(
        "q",
        "later",
        every="1h",
        start_at="2030-01-02T09:30:00+01:00",
        template=TEMPLATE,
        now_ms=clock(),
    )
    assert repeat.next_runs("q", "later", 2) == [
        ms(datetime(2030, 1, 2, 9, tzinfo=UTC)),
        ms(datetime(2030, 1, 2, 10, tzinfo=UTC)),
    ]
    repeat.register(
        "q", "over", every="1h", end_at="2030-01-01T10:00:00Z", template=TEMPLATE, now_ms=clock()
    )
    over = repeat.get("q", "over")
    assert over is not None and over.completed == "end_at" and over.next_run_ms is None
    # Extending the end brings it back, on its grid.
    repeat.upsert(
        "q", "over", every="1h", end_at="2030-01-01T12:00:00Z", template=TEMPLATE, now_ms=clock()
    )
    back = repeat.get("q", "over")
    assert back is not None and back.completed is None
    assert back.upcoming(5) == [ms(datetime(2030, 1, 1, h, tzinfo=UTC)) for h in (11, 12)]


# -- limit ------------------------------------------------------------------------------


def test_limit_counts_runs_not_triggers_and_completes(repeat: Repeat) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC))
    repeat.register("q", "job", every="1m", limit=3, template=TEMPLATE, now_ms=clock())
    repeat.trigger("q", "job", now_ms=clock())
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    for _ in range(10):
        pump.run_once()
        clock.advance(40_000)
    scheduled = [o for o in recorder.occurrences if not o.triggered]
    assert len(scheduled) == 3 and len(recorder.occurrences) == 4
    done = repeat.get("q", "job")
    assert done is not None and done.completed == "limit" and done.remaining == 0
    assert repeat.count("q") == 1  # the member stays, at +inf
    # Raising the limit gives the difference back.
    repeat.register("q", "other", every="1m", limit=5, template=TEMPLATE, now_ms=clock())
    repeat.upsert("q", "job", every="1m", limit=5, template=TEMPLATE, now_ms=clock())
    again = repeat.get("q", "job")
    assert again is not None and again.completed is None and again.remaining == 2


def test_a_limit_lowered_under_the_runs_made_then_raised_never_allows_more_runs(
    repeat: Repeat,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC))
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)

    def limit(n: int) -> None:
        repeat.upsert("q", "job", every="1m", limit=n, template=TEMPLATE, now_ms=clock())

    def run(minutes: int) -> None:
        for _ in range(minutes * 2):
            pump.run_once()
            clock.advance(30_000)

    limit(3)
    run(5)
    assert len(recorder.occurrences) == 3  # completed
    limit(1)  # under the 3 runs made: completed, 0 remaining shown
    lowered = repeat.get("q", "job")
    assert lowered is not None and lowered.completed == "limit" and lowered.remaining == 0
    limit(4)  # one run more than the 3 made
    run(5)
    assert len(recorder.occurrences) == 4
    done = repeat.get("q", "job")
    assert done is not None and done.completed == "limit" and done.remaining == 0


def test_limit_with_three_racing_pumps_runs_exactly_n_times(repeat: Repeat) -> None:
    import threading

    repeat.register("q", "race", every_ms=5, limit=40, template=TEMPLATE)
    recorders = [RecordingDispatcher() for _ in range(3)]
    pumps = [Pump(repeat, ["q"], recorder) for recorder in recorders]
    done = threading.Event()

    def loop(pump: Pump) -> None:
        while not done.is_set():
            pump.run_once()
            # Each pass gives the GIL away: else one thread could claim all 40 slots within
            # its switch intervals and the pumps never race (seen once in CI on Redis 7).
            time.sleep(0.001)

    threads = [threading.Thread(target=loop, args=(p,)) for p in pumps]
    for thread in threads:
        thread.start()
    deadline = datetime.now(UTC) + timedelta(seconds=20)
    while datetime.now(UTC) < deadline:
        registration = repeat.get("q", "race")
        if registration is not None and registration.completed:
            break
    done.set()
    for thread in threads:
        thread.join()
    for pump in pumps:
        pump.run_once()
    fired = [o.due_ms for r in recorders for o in r.occurrences]
    assert len(fired) == 40 and len(set(fired)) == 40
    assert sum(1 for r in recorders if r.occurrences) >= 2  # they did race
    final = repeat.get("q", "race")
    assert final is not None and final.completed == "limit" and final.remaining == 0


# -- one-offs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "walls"),
    [
        ("Europe/Paris", [((2026, 10, 25, 2, 30), 0), ((2026, 10, 25, 2, 30), 1)]),
        ("America/New_York", [((2026, 3, 8, 1, 59), 0), ((2026, 3, 8, 3, 0), 0)]),
        ("Australia/Lord_Howe", [((2026, 4, 5, 1, 45), 0), ((2026, 4, 5, 1, 45), 1)]),
        ("Asia/Tehran", [((2022, 3, 21, 23, 30), 0), ((2022, 9, 21, 23, 30), 1)]),
    ],
)
def test_one_offs_fire_once_each_then_complete(
    repeat: Repeat, zone: str, walls: list[tuple[tuple[int, ...], int]]
) -> None:
    tz = ZoneInfo(zone)
    instants = [datetime(*wall, tzinfo=tz, fold=fold) for wall, fold in walls]
    expected = sorted(wall_instant(datetime(*wall), zone, fold) for wall, fold in walls)
    clock = ManualClock(expected[0] - 61 * MIN)
    repeat.register("q", "once", at=instants, template=TEMPLATE, now_ms=clock())
    repeat.register("q", "single", at=instants[-1], template=TEMPLATE, now_ms=clock())
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder, clock=clock)
    step = max(60_000, min(b - a for a, b in pairwise(expected)) // 3)
    while clock() <= expected[-1] + 5 * MIN:
        pump.run_once()
        clock.advance(min(step, 20 * MIN))
    pump.run_once()
    assert sorted(o.due_ms for o in recorder.occurrences if o.name == "once") == expected
    assert [o.due_ms for o in recorder.occurrences if o.name == "single"] == [expected[-1]]
    for registration in repeat.list("q"):
        assert registration.completed == "at" and registration.upcoming(2) == []


def test_a_one_off_already_past_at_registration_is_created_completed(repeat: Repeat) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, tzinfo=UTC))
    repeat.register("q", "late", at="2030-01-01T09:00:00Z", template=TEMPLATE, now_ms=clock())
    late = repeat.get("q", "late")
    assert late is not None and late.completed == "at"
    assert drive(repeat, clock, clock() + 10 * MIN, MIN) == []


def test_pause_and_resume_keep_a_completed_one_completed_and_complete_one_past_its_end(
    repeat: Repeat,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 10, 7, 23, tzinfo=UTC))
    repeat.register("q", "done", every="1m", limit=1, template=TEMPLATE, now_ms=clock())
    end = datetime(2030, 1, 1, 10, 30, tzinfo=UTC)
    repeat.register("q", "ends", every="1m", end_at=end, template=TEMPLATE, now_ms=clock())
    assert len(drive(repeat, clock, clock() + 2 * MIN, 30_000)) == 3  # done once, ends twice
    assert repeat.pause("q", "done") and repeat.pause("q", "ends")
    clock.set(datetime(2030, 1, 1, 11, tzinfo=UTC))  # past the end while paused
    assert repeat.resume("q", "done", now_ms=clock()) and repeat.resume("q", "ends", now_ms=clock())
    for name, reason in (("done", "limit"), ("ends", "end_at")):
        registration = repeat.get("q", name)
        assert registration is not None and not registration.paused
        assert registration.completed == reason and registration.next_run_ms is None
    assert drive(repeat, clock, clock() + 5 * MIN, MIN) == []
    # A trigger still fires a completed registration, once, and consumes nothing.
    repeat.trigger("q", "done", now_ms=clock())
    recorder = RecordingDispatcher()
    Pump(repeat, ["q"], recorder, clock=clock).run_once()
    assert [o.triggered for o in recorder.occurrences] == [True]
