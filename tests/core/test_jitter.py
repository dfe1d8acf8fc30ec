"""Jitter: each slot sent at its nominal time plus a deterministic offset, within the bound
and before the next slot; the id and nominal time stay the slot's. Held against the
brute-force cron oracle across DST, pumped, and declared through every surface."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from cron_oracle import Oracle, transitions

from emq_bridge import ConfigError, Cron, Pump, Repeat, ScheduleError, occurrence_id
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file
from emq_bridge.definition import Schedule, define
from emq_bridge.jitter import Jittered, nominal_of
from emq_bridge.testing import RecordingDispatcher

UTC = timezone.utc
MIN = 60_000
ZONES = [
    ("Europe/Paris", 2026),
    ("America/New_York", 2026),
    ("Australia/Lord_Howe", 2026),
    ("America/Mexico_City", 2022),  # abolished DST in 2022: its last transitions
]


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


@pytest.mark.parametrize(("tz", "year"), ZONES)
@pytest.mark.parametrize(
    ("expr", "jitter_ms"),
    [("30 2 * * *", 45 * MIN), ("*/15 * * * *", 20 * MIN), ("0 */2 * * *", 3 * 60 * MIN)],
)
def test_jittered_runs_keep_every_oracle_slot_once_in_order_within_the_bound(
    tz: str, year: int, expr: str, jitter_ms: int
) -> None:
    cadence = Jittered(Cron(expr, tz), jitter_ms, f"{tz}/{expr}")
    for moment in transitions(tz, year):
        start, end = moment - timedelta(days=1), moment + timedelta(days=1)
        slots = Oracle(expr, tz).fires(start, end + timedelta(days=1))
        # From just before the first slot: no earlier slot's offset reaches past it.
        sent, at = [], slots[0] - 1
        while len(sent) < len([s for s in slots if s <= ms(end)]):
            at = cadence.next_after(at)
            sent.append(at)
        for index, instant in enumerate(sent):
            nominal, following = slots[index], slots[index + 1]
            assert cadence.nominal(instant) == nominal
            assert 0 <= instant - nominal <= min(jitter_ms, following - nominal - 1)
        assert sent == sorted(set(sent))  # strictly increasing: none merged, none reordered


def test_offsets_are_deterministic_per_name_and_spread_over_the_bound() -> None:
    every = define(every="1m").cadence
    one, same, other = (Jittered(every, 30_000, seed) for seed in ("a", "a", "b"))
    slots = [i * MIN for i in range(1, 501)]
    offsets = [one.offset(s) for s in slots]
    assert offsets == [same.offset(s) for s in slots]
    assert sum(o != other.offset(s) for o, s in zip(offsets, slots, strict=True)) > 480
    assert min(offsets) < 3_000 and max(offsets) > 27_000
    assert all(0 <= o <= 30_000 for o in offsets)


def test_a_bound_larger_than_the_interval_stays_before_the_next_slot() -> None:
    cadence = Jittered(define(every="10s").cadence, 3_600_000, "x")
    for slot in range(10_000, 10_000 * 200, 10_000):
        assert 0 <= cadence.offset(slot) < 10_000
        assert nominal_of(cadence.inner, cadence.at(slot), 3_600_000) == slot


def test_a_pump_sends_at_the_jittered_instant_with_the_nominal_id_and_time(
    repeat: Repeat,
) -> None:
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    definition = define(every="1m", jitter="20s", template={"task": "t"})
    repeat.upsert("q", "spread", definition=definition, now_ms=t0)
    cadence = repeat.get("q", "spread").definition.cadence  # type: ignore[union-attr]
    assert isinstance(cadence, Jittered) and cadence.seed == "spread"
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    for second in range(1, 10 * 60 + 21):  # the 10th slot's offset is at most 20 s
        pump.run_once(t0 + second * 1000)
    dues = [o.due_ms for o in recorder.occurrences]
    assert dues == [t0 + i * MIN for i in range(1, 11)]
    for occurrence in recorder.occurrences:
        assert occurrence.id == occurrence_id(repeat.prefix, "q", "spread", occurrence.due_ms)
        sent_at = cadence.at(occurrence.due_ms)
        assert sent_at <= occurrence.released_ms < sent_at + 1000  # the tick after the offset
    assert len({o.released_ms - o.due_ms for o in recorder.occurrences}) > 5


def test_a_jittered_score_written_again_for_a_fired_slot_never_fires_it_twice(
    repeat: Repeat,
) -> None:
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    repeat.upsert("q", "j", definition=define(every="1m", jitter="30s"), now_ms=t0)
    cadence = repeat.get("q", "j").definition.cadence  # type: ignore[union-attr]
    assert isinstance(cadence, Jittered)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once(t0 + MIN + 30_000)
    assert [o.due_ms for o in recorder.occurrences] == [t0 + MIN]
    # A stalled sync derives the same slot again, with its jittered score (upsert.lua only
    # knows the score is after the last fired slot): claim.lua refuses to fire it again.
    repeat.client.zadd(repeat.keys("q").registry, {"j": cadence.at(t0 + MIN)})
    pump.run_once(t0 + MIN + 31_000)
    assert [o.due_ms for o in recorder.occurrences] == [t0 + MIN]
    pump.run_once(t0 + 2 * MIN + 30_000)
    assert [o.due_ms for o in recorder.occurrences] == [t0 + MIN, t0 + 2 * MIN]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"every": "1m", "jitter": "2d"}, "at most 1 day"),
        ({"every": "1m", "jitter": "soon"}, "jitter"),
        ({"every": "1m", "jitter": -5}, "jitter"),
        ({"every": "1m", "jitter": "10s", "anchor": "release"}, "grid"),
    ],
)
def test_a_bad_jitter_is_one_clear_error_and_nothing_is_written(
    fields: dict[str, object],
    message: str,
    repeat: Repeat,
    tmp_path: Path,
    redis_url: str,
    prefix: str,
) -> None:
    with pytest.raises(ScheduleError, match=message):
        define(**fields)  # type: ignore[arg-type]
    path = tmp_path / "s.toml"
    lines = "".join(
        f"{k} = {v!r}\n".replace("'", '"') if isinstance(v, str) else f"{k} = {v}\n"
        for k, v in fields.items()
    )
    path.write_text(f'queue = "q"\n[[schedule]]\nname = "bad"\ntask = "t"\n{lines}')
    with pytest.raises(ConfigError, match=r"field '(jitter|anchor)'"):
        load_schedule_file(path)
    args = [f"--{k}={v}" for k, v in fields.items()]
    result = CliRunner().invoke(
        cli, ["--redis-url", redis_url, "--prefix", prefix, "add", "q", "bad", "--task", "t", *args]
    )
    assert result.exit_code == 1, result.output
    assert repeat.names("q") == []


def test_jitter_through_toml_both_decorators_and_the_cli_and_next_shows_the_slot(
    repeat: Repeat, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.celery.declare import app_schedule, recurring
    from emq_bridge.dramatiq.schedule import actor_declarations, cron
    from emq_bridge.dramatiq.schedule import recurring as dramatiq_recurring

    path = tmp_path / "s.toml"
    path.write_text(
        'queue = "q"\n[[schedule]]\nname = "poll"\ntask = "t"\ncron = "H * * * *"\njitter = "90s"\n'
    )
    (from_file,) = load_schedule_file(path).declarations
    assert from_file.definition.to_fields()["jitter_ms"] == "90000"
    assert from_file.definition.to_fields()["seed"] == "poll"
    app = Celery("jitter_test", set_as_current=False)

    @recurring(every="15m", jitter=30)
    @app.task(name="app.poll")
    def poll() -> None: ...

    (from_celery,) = app_schedule(app).tasks
    assert from_celery.definition.to_fields()["jitter_ms"] == "30000"
    assert from_celery.definition.to_fields()["seed"] == "app.poll"
    broker = RedisBroker(url=redis_url, namespace=f"{prefix}-dq")

    @dramatiq_recurring(every="15m", jitter=timedelta(seconds=45), name="first")
    @dramatiq_recurring(cron="0 * * * *", jitter="1m")
    @dramatiq.actor(broker=broker, actor_name="poll_actor")
    def poll_actor() -> None: ...

    declared = {d.name: d.definition.to_fields() for d in actor_declarations(poll_actor)}
    assert declared["first"]["jitter_ms"] == "45000"
    assert declared["poll_actor"]["jitter_ms"] == "60000"
    assert Schedule(every="1h", jitter="5m").bind("t", "q").definition.to_fields()["seed"] == "t"
    assert cron("0 * * * *", jitter="1m").jitter == "1m"  # the actor option's builder

    base = ["--redis-url", redis_url, "--prefix", prefix]
    added = CliRunner().invoke(
        cli,
        [*base, "add", "q", "spread", "--task", "t", "--every", "1h", "--jitter", "10m"],
        catch_exceptions=False,
    )
    assert added.exit_code == 0, added.output
    assert "jitter up to 10m" in added.output
    shown = CliRunner().invoke(cli, [*base, "next", "q", "spread", "-n", "3", "--json"])
    runs = __import__("json").loads(shown.output)
    assert all(r["nominal_ms"] % 3_600_000 == 0 for r in runs)
    assert all(0 <= r["at_ms"] - r["nominal_ms"] <= 600_000 for r in runs)
    text = CliRunner().invoke(cli, [*base, "next", "q", "spread", "-n", "1"]).output
    assert "jittered from" in text or runs[0]["at_ms"] == runs[0]["nominal_ms"]


def test_after_an_outage_the_misfire_policy_fires_the_newest_nominal_slot_once(
    repeat: Repeat,
) -> None:
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    repeat.upsert("q", "late", definition=define(every="1m", jitter="20s"), now_ms=t0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once(t0 + 10 * MIN + 30_000)  # the first run after ten minutes without a pump
    (fired,) = recorder.occurrences
    cadence = repeat.get("q", "late").definition.cadence  # type: ignore[union-attr]
    newest = max(
        t0 + i * MIN for i in range(1, 11) if cadence.at(t0 + i * MIN) <= fired.released_ms
    )  # type: ignore[attr-defined]
    assert fired.due_ms == newest and fired.id == occurrence_id(repeat.prefix, "q", "late", newest)
    record = repeat.get("q", "late")
    assert record is not None and record.missed == (newest - t0) // MIN - 1


def test_the_missed_slots_line_names_nominal_slots_not_jittered_instants(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = ms(datetime(2026, 6, 1, tzinfo=UTC))
    repeat.upsert("q", "late", definition=define(every="1m", jitter="20s"), now_ms=t0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    with caplog.at_level("WARNING", logger="emq_bridge.pump"):
        pump.run_once(t0 + 10 * MIN + 30_000)
    (line,) = [r.getMessage() for r in caplog.records if "missed, unclaimed in time" in r.message]
    instants = re.findall(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", line)
    assert len(instants) == 3, line  # the first and last slots passed, the one that fires
    for text in instants:  # every one a minute's slot, none a jittered instant
        assert datetime.fromisoformat(text).second == 0, line
        assert datetime.fromisoformat(text).microsecond == 0, line


def test_a_start_at_inside_a_slots_jitter_begins_at_the_next_slot() -> None:
    """The slot before `start_at` is outside the bounds even when its jittered instant falls
    after the start: the first run is the first slot at or after the start, jittered."""
    from emq_bridge.bounds import Bounds

    every = define(every="1m").cadence
    slot = 10 * MIN
    seed = next(
        s
        for s in (f"job-{i}" for i in range(1000))
        if Jittered(every, 50_000, s).offset(slot) > 20_000
    )
    cadence = Jittered(every, 50_000, seed)
    start = slot + 10_000  # after the slot, before its jittered instant
    assert cadence.at(slot) > start
    first = Bounds(start_ms=start).first_run(cadence, now_ms=slot - MIN)
    assert first == cadence.at(slot + MIN)
    assert nominal_of(every, first, 50_000) == slot + MIN


@pytest.mark.parametrize("seed", ["a", "b", "c", "d", "e", "f"])
def test_the_last_slot_before_the_end_fires_whatever_its_jitter(repeat: Repeat, seed: str) -> None:
    # An end at 12:00 takes the 12:00 slot (end_at is inclusive); its jittered instant would
    # fall after the end, so it is sent at the end at the latest, and fires.
    t0 = ms(datetime(2030, 1, 1, 9, 30, tzinfo=UTC))
    end = "2030-01-01T12:00:00Z"
    definition = define(every="1h", jitter="30m", end_at=end, seed=seed, template={"task": "t"})
    repeat.upsert("q", seed, definition=definition, now_ms=t0)
    registration = repeat.get("q", seed)
    assert registration is not None
    slots = [t0 + i * 30 * MIN for i in (1, 3, 5)]  # 10:00, 11:00, 12:00
    upcoming = registration.upcoming(5)
    assert len(upcoming) == 3 and upcoming[-1] == slots[-1]  # the last: sent at the end
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    for minute in range(4 * 60):
        pump.run_once(t0 + minute * MIN)
    assert [o.due_ms for o in recorder.occurrences] == slots
    done = repeat.get("q", seed)
    assert done is not None and done.completed == "end_at" and done.missed == 0


def test_an_outage_across_the_end_fires_the_last_slot_before_it(repeat: Repeat) -> None:
    t0 = ms(datetime(2030, 1, 1, 5, 0, tzinfo=UTC))
    definition = define(every="1h", jitter="1h", end_at="2030-01-01T08:09:00Z", template={})
    repeat.upsert("q", "late", definition=definition, now_ms=t0)
    recorder = RecordingDispatcher()
    Pump(repeat, ["q"], recorder).run_once(t0 + 5 * 60 * MIN)  # no pump from 05:00 to 10:00
    assert [o.due_ms for o in recorder.occurrences] == [t0 + 3 * 60 * MIN]  # 08:00 ("latest")
    done = repeat.get("q", "late")
    assert done is not None and done.missed == 2  # 06:00 and 07:00


@pytest.mark.parametrize("jitter", [None, "10m", "59m"])
def test_a_jitter_edited_before_a_slot_is_sent_still_sends_that_slot_once(
    repeat: Repeat, jitter: str | None
) -> None:
    # The 10:00 slot is due to be sent at 10:xx under a 50-minute jitter; at 10:01 the
    # jitter is removed, cut or raised: its new instant may be past already, and the next
    # run was derived from now, so the slot was never sent (nor counted missed).
    t0 = ms(datetime(2030, 1, 1, 9, 30, tzinfo=UTC))
    hour = 60 * MIN

    def declare(jitter_of: str | None, seed: str = "s") -> None:
        extra = {} if jitter_of is None else {"jitter": jitter_of, "seed": seed}
        definition = define(every="1h", template={"task": "t"}, **extra)  # type: ignore[arg-type]
        repeat.upsert("q", "a", definition=definition, now_ms=clock[0])

    clock = [t0]
    seed = next(s for s in map(str, range(100)) if _offset_of(s, t0 + 30 * MIN) > 2 * MIN)
    declare("50m", seed)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    clock[0] = t0 + 31 * MIN  # 10:01: the 10:00 slot is still to be sent
    assert pump.run_once(clock[0]).dispatched == []
    declare(jitter, seed)
    for minute in range(31, 31 + 3 * 60):  # to 13:01
        pump.run_once(t0 + minute * MIN)
    fired = [o.due_ms for o in recorder.occurrences]
    slots = [t0 + 30 * MIN + i * hour for i in range(4)]  # 10:00 to 13:00
    assert fired[:3] == slots[:3] and fired[3:] in ([], slots[3:])  # 13:00 may be later
    registration = repeat.get("q", "a")
    assert registration is not None and registration.missed == 0


def test_a_jitter_edited_after_its_slot_was_sent_does_not_send_it_again(repeat: Repeat) -> None:
    t0 = ms(datetime(2030, 1, 1, 9, 30, tzinfo=UTC))
    definition = define(every="1h", jitter="50m", seed="s", template={"task": "t"})
    repeat.upsert("q", "a", definition=definition, now_ms=t0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    for minute in range(0, 85):  # to 10:55: the 10:00 slot is sent (by 10:50)
        pump.run_once(t0 + minute * MIN)
    assert [o.due_ms for o in recorder.occurrences] == [t0 + 30 * MIN]
    edited = define(every="1h", template={"task": "t"})  # its 10:00 is past, but was sent
    repeat.upsert("q", "a", definition=edited, now_ms=t0 + 85 * MIN)
    for minute in range(85, 150):
        pump.run_once(t0 + minute * MIN)
    assert [o.due_ms for o in recorder.occurrences] == [t0 + 30 * MIN, t0 + 90 * MIN]


def _offset_of(seed: str, slot_ms: int) -> int:
    """The offset of `slot_ms` under the hourly 50-minute jitter seeded `seed`."""
    return Jittered(define(every="1h").cadence, 50 * MIN, seed).offset(slot_ms)
