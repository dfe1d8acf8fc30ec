"""Celery's schedules as Celery's own beat runs them: a differential test, and the registry view.

Celery's `celery.beat.Scheduler` and emq-bridge's pump (with the Celery cadence resolver,
as `celery beat -S emq` builds it) run one `beat_schedule`, the same schedule objects, side
by side on one controlled clock: `STEP` by `STEP` from `START` to `END`, Celery's `tick`
called until it has nothing left to do at that instant, the pump's `run_once` once. Every
entry must fire at the same instants in both. Celery's beat only asks `is_due(last_run_at)`
and reads its second value as "check again in N s"; that is what the custom classes below
exercise: one that defines only `is_due`, one only `remaining_estimate`, one both, a crontab
subclass that overrides only `is_due` (a holiday calendar), one whose `is_due` never says yes.
The app's time zone is Paris, and Celery's side reads the clock as `app.now()` does, in that
zone: so do the schedules that read the hour or the date of `now()` and `last_run_at`, and
`schedule(relative=True)` rounding to Paris days (emq-bridge once gave them UTC datetimes).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import BaseSchedule, crontab, schedstate, schedule, solar
from click.testing import CliRunner

from emq_bridge import Every, Pump, Repeat
from emq_bridge.celery import app_schedule
from emq_bridge.celery.entries import CelerySchedule, convert_schedule
from emq_bridge.cli import cli
from emq_bridge.errors import ConfigError
from emq_bridge.testing import ManualClock, RecordingDispatcher

START = datetime(2030, 6, 1, tzinfo=timezone.utc)  # Paris keeps CEST throughout
END = START + timedelta(days=2, hours=12)
STEP = timedelta(seconds=10)
HOLIDAY = date(2030, 6, 2)
MS = 1000


def record() -> None:
    return None


class CheckedEveryTwentySeconds(BaseSchedule):
    """`is_due` only: due 20 s after its last run, checked every 3 s."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate((self.now() - last_run_at).total_seconds() >= 20, 3)


class NeverDue(BaseSchedule):
    """`is_due` only: always "not due, check again in 2 s"."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(False, 2)


class CheckedEveryTwentyMinutes(BaseSchedule):
    """`is_due` only: due 20 min after its last run, checked every 45 s (issue 12.5's shape)."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        elapsed = (self.now() - last_run_at).total_seconds()
        return schedstate(elapsed >= 20 * 60, 45)


class SwitchedOff(BaseSchedule):
    """`is_due` only, behind a feature flag that is off: never due, checked every 2 min."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(False, 120)


class SeventeenMinutesAfterTheLastRun(BaseSchedule):
    """`remaining_estimate` only: Celery's beat cannot run it (its `is_due` raises)."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return last_run_at + timedelta(minutes=17) - self.now()


class WithCeleryIsDue(SeventeenMinutesAfterTheLastRun):
    """The same, with the `is_due` Celery's own schedules share (`solar.is_due`)."""

    is_due = solar.is_due


class SevenMinuteGrid(BaseSchedule):
    """Both methods, agreeing: every 7 minutes of the wall clock (UTC)."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        base = last_run_at.astimezone(timezone.utc).replace(second=0, microsecond=0)
        minutes = base.hour * 60 + base.minute
        nxt = base + timedelta(minutes=7 - minutes % 7)
        return nxt - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        if remaining > 0:
            return schedstate(False, remaining)
        return schedstate(True, self.remaining_estimate(self.now()).total_seconds())


class WorkdayCrontab(crontab):
    """A crontab that overrides only `is_due`: it never fires on a holiday (the usual pattern)."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = self.now()
        if now.astimezone(self.tz).date() == HOLIDAY:
            return schedstate(False, self.remaining_estimate(now).total_seconds())
        return super().is_due(last_run_at)


class MorningsInTheAppsZone(BaseSchedule):
    """`is_due` only, reading the hour of `now()`: every 20 min from 07:00 to 08:59 by the
    clock `now()` shows (the app's zone, in Celery's beat), checked every minute."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = self.now()
        due = 7 <= now.hour < 9 and now - last_run_at >= timedelta(minutes=20)
        return schedstate(due, 60)


class OncePerLocalDay(BaseSchedule):
    """`is_due` only, reading dates: due at the first check of a day other than the last
    run's, by the zone the datetimes come in (the app's, in Celery's beat); every 5 min."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(self.now().date() != last_run_at.date(), 300)


def two_days() -> dict[str, Any]:
    return {
        "interval-10s": schedule(timedelta(seconds=10)),
        "crontab-half-hours": crontab(minute="*/30"),
        "crontab-06-45": crontab(minute=45, hour=6),
        "relative-15m": schedule(timedelta(minutes=15), relative=True),
        "sunrise": solar("sunrise", 48.85, 2.35),
        "sunset": solar("sunset", 48.85, 2.35),
        "is-due-only": CheckedEveryTwentyMinutes(),
        "switched-off": SwitchedOff(),
        "remaining-only": SeventeenMinutesAfterTheLastRun(),
        "remaining-only-with-celery-is-due": WithCeleryIsDue(),
        "both-agreeing": SevenMinuteGrid(),
        "workday-crontab": WorkdayCrontab(minute=0, hour="9,17"),
        "mornings-in-the-apps-zone": MorningsInTheAppsZone(),
        "once-per-local-day": OncePerLocalDay(),
        "relative-daily": schedule(timedelta(days=1), relative=True),
    }


class RecordingScheduler(Scheduler):  # type: ignore[misc]
    """Celery's own beat scheduler, recording what it sends instead of sending it."""

    producer = None  # the base class opens a broker connection here

    def __init__(
        self, app: Celery, clock: ManualClock, fired: dict[str, list[int]], state: Any
    ) -> None:
        self.clock = clock
        self.fired = fired
        super().__init__(app, schedule=state)  # a restarted beat keeps its entries' last runs

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **_: Any) -> None:
        self.fired.setdefault(entry.name, []).append(self.clock.now_ms)


def utc(clock: ManualClock) -> datetime:
    return datetime.fromtimestamp(clock.now_ms / MS, timezone.utc)


def ms(at: datetime) -> int:
    return int(at.timestamp() * MS)


class SideBySide:
    """Celery's beat and emq-bridge's beat (sync, then a pump with the app's resolver) on one
    clock and one `beat_schedule`; `deploy` again is a restart on an edited schedule."""

    def __init__(self, redis_url: str, start: datetime) -> None:
        self.clock = ManualClock(start)
        self.prefix = f"t{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(redis_url)
        self.repeat = Repeat(self.client, self.prefix)
        self.recorder = RecordingDispatcher()
        self.celery_fired: dict[str, list[int]] = {}
        self.beat: RecordingScheduler | None = None
        self.pump: Pump | None = None
        self.queue = f"{self.prefix}-q"

    def deploy(self, schedules: dict[str, Any]) -> None:
        app = Celery("differential", set_as_current=False)
        app.conf.update(
            timezone="Europe/Paris",
            beat_schedule={n: {"task": "t.record", "schedule": s} for n, s in schedules.items()},
            result_backend=None,
            result_expires=None,
            task_default_queue=self.queue,
        )
        app.task(name="t.record", shared=False)(record)
        # Celery's side: its `app.now()` on the manual clock, in the app's zone as Celery's
        # own is (a schedule's `now()` reads it); emq-bridge pins each check's to the pump's.
        zone = app.timezone
        app.now = lambda: utc(self.clock).astimezone(zone)  # type: ignore[method-assign]
        state = None if self.beat is None else self.beat.schedule
        self.beat = RecordingScheduler(app, self.clock, self.celery_fired, state)
        plan = app_schedule(app)
        declared = [(d.queue, d.name, d.definition) for d in plan.declarations]
        self.repeat.upsert_many(declared, source=plan.source, now_ms=self.clock.now_ms)
        self.pump = Pump(
            self.repeat,
            plan.queues,
            self.recorder,
            clock=self.clock,
            resolve_cadence=plan.resolve_cadence,
        )

    def run(self, until: datetime, step: timedelta) -> None:
        assert self.beat is not None and self.pump is not None
        while self.clock.now_ms <= ms(until):
            for _ in range(100):  # a tick sends one entry; 0 means "call me again now"
                if self.beat.tick() > 0:
                    break
            self.pump.run_once()
            self.clock.advance(step)

    def fired(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """Return the fire times (epoch ms) of each entry: Celery's, emq-bridge's."""
        emq: dict[str, list[int]] = {}
        for occurrence in self.recorder.occurrences:
            emq.setdefault(occurrence.name, []).append(occurrence.released_ms)
        return self.celery_fired, emq

    def close(self) -> None:
        self.client.close()


Fires = tuple[dict[str, list[int]], dict[str, list[int]]]


@pytest.fixture(scope="module")
def over_two_days(redis_url: str) -> Iterator[Fires]:
    """Every schedule of `two_days`, 10-second steps from 1 June 00:00 to 3 June 12:00 UTC."""
    sim = SideBySide(redis_url, START)
    sim.deploy(two_days())
    sim.run(END, STEP)
    yield sim.fired()
    sim.close()


@pytest.fixture(scope="module")
def over_ten_minutes(redis_url: str) -> Iterator[Fires]:
    """The two shapes issue 12.5 measured, in 1-second steps."""
    sim = SideBySide(redis_url, START)
    sim.deploy({"twenty-seconds": CheckedEveryTwentySeconds(), "never-due": NeverDue()})
    sim.run(START + timedelta(minutes=10), timedelta(seconds=1))
    yield sim.fired()
    sim.close()


def iso(times: list[int]) -> list[str]:
    return [datetime.fromtimestamp(t / MS, timezone.utc).isoformat() for t in times]


SAME = [
    "interval-10s",
    "crontab-half-hours",
    "crontab-06-45",
    "relative-15m",
    "sunrise",
    "sunset",
    "is-due-only",
    "switched-off",
    "both-agreeing",
    "workday-crontab",
    "mornings-in-the-apps-zone",
    "once-per-local-day",
    "relative-daily",
]


@pytest.mark.parametrize("name", SAME)
def test_each_schedule_fires_at_the_instants_celerys_own_beat_fires_it(
    over_two_days: Fires, name: str
) -> None:
    celery, emq = over_two_days
    assert iso(emq.get(name, [])) == iso(celery.get(name, []))


@pytest.mark.parametrize("name", ["twenty-seconds", "never-due"])
def test_is_due_saying_not_yet_is_a_check_in_n_seconds_not_a_run(
    over_ten_minutes: Fires, name: str
) -> None:
    celery, emq = over_ten_minutes
    assert iso(emq.get(name, [])) == iso(celery.get(name, []))


def test_the_simulations_exercise_what_they_claim(
    over_two_days: Fires, over_ten_minutes: Fires
) -> None:
    celery, _ = over_two_days
    counts = {name: len(celery.get(name, [])) for name in SAME}
    assert counts["switched-off"] == 0
    assert counts["workday-crontab"] == 3  # 1 June at 09:00 and 17:00, 3 June at 09:00
    assert (counts["sunrise"], counts["sunset"]) == (3, 2)
    assert counts["interval-10s"] == 2.5 * 86_400 / 10
    assert all(n > 0 for name, n in counts.items() if name != "switched-off"), counts
    # The app's zone is what Celery's beat shows them: Paris hours, Paris midnights (CEST).
    runs = celery["mornings-in-the-apps-zone"]
    mornings = [datetime.fromtimestamp(t / MS, timezone.utc) for t in runs]
    assert len(mornings) == 18 and {t.hour for t in mornings} == {5, 6}  # 07:00-08:40
    midnights = ["2030-06-01T22:00:00+00:00", "2030-06-02T22:00:00+00:00"]
    assert iso(celery["once-per-local-day"]) == iso(celery["relative-daily"]) == midnights
    short, _ = over_ten_minutes
    assert len(short["twenty-seconds"]) == 28  # every 21 s: 20 s, then the next 3-s check
    assert "never-due" not in short


def test_a_remaining_estimate_only_class_runs_as_celerys_own_is_due_would_run_it(
    over_two_days: Fires,
) -> None:
    celery, emq = over_two_days
    # Celery's beat cannot run it: BaseSchedule.is_due raises NotImplementedError each check.
    assert celery.get("remaining-only", []) == []
    expected = celery["remaining-only-with-celery-is-due"]
    assert len(expected) > 100
    assert iso(emq["remaining-only"]) == iso(expected)
    assert iso(emq["remaining-only-with-celery-is-due"]) == iso(expected)


def test_an_edited_solar_entry_takes_effect_at_once_as_in_a_restarted_celery_beat(
    redis_url: str,
) -> None:
    sim = SideBySide(redis_url, START)
    sim.deploy({"sun": solar("sunrise", 48.85, 2.35)})
    noon = START + timedelta(hours=12)
    sim.run(noon, STEP)
    sim.deploy({"sun": solar("sunset", 48.85, 2.35)})  # restarted on the edited entry
    registration = sim.repeat.get(sim.queue, "sun")
    assert registration is not None and registration.next_run_ms is not None
    # The next check was derived again from the new schedule: this evening's sunset.
    assert noon < datetime.fromtimestamp(registration.next_run_ms / MS, timezone.utc)
    assert registration.next_run_ms < ms(START + timedelta(hours=21))
    sim.run(noon + timedelta(days=1), STEP)
    celery, emq = sim.fired()
    sim.close()
    assert iso(emq["sun"]) == iso(celery["sun"])
    sunrise, sunset = (datetime.fromtimestamp(t / MS, timezone.utc) for t in emq["sun"])
    assert (sunrise.date(), sunrise.hour) == (START.date(), 3)  # 05:5x in Paris
    assert (sunset.date(), sunset.hour) == (START.date(), 19)  # the same evening


def test_an_edit_of_a_custom_schedule_is_a_cadence_change() -> None:
    app = Celery("x", set_as_current=False)
    sunrise = convert_schedule(solar("sunrise", 48.85, 2.35), app, "x")
    sunset = convert_schedule(solar("sunset", 48.85, 2.35), app, "x")
    assert sunrise.to_fields() != sunset.to_fields()  # so upsert derives the next run again
    assert sunset.to_fields()["every_ms"] == "86400000"  # what a plain pump reads
    assert sunset.describe() == "celery <solar: sunset at latitude 48.85, longitude: 2.35>"


def test_list_next_and_show_describe_a_custom_schedule_and_its_next_check(
    redis_url: str, prefix: str
) -> None:
    clock = ManualClock(START)
    app = Celery("cli", set_as_current=False)
    app.conf.update(
        timezone="Europe/Paris",
        task_default_queue="reports",
        result_backend=None,
        result_expires=None,
        beat_schedule={
            "sunrise": {"task": "t.record", "schedule": solar("sunrise", 48.85, 2.35)},
            "checked": {"task": "t.record", "schedule": CheckedEveryTwentyMinutes()},
        },
    )
    app.task(name="t.record", shared=False)(record)
    client = redis.Redis.from_url(redis_url)
    repeat = Repeat(client, prefix)
    plan = app_schedule(app)
    repeat.upsert_many(
        [(d.queue, d.name, d.definition) for d in plan.declarations], now_ms=clock.now_ms
    )
    Pump(repeat, ["reports"], RecordingDispatcher(), clock=clock).run_once()  # no resolver
    client.close()

    def run(*args: str) -> str:
        result = CliRunner().invoke(
            cli, ["--redis-url", redis_url, "--prefix", prefix, *args], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return result.output

    sunrise = "celery <solar: sunrise at latitude 48.85, longitude: 2.35>"
    listed = run("list", "reports")
    assert sunrise in listed
    assert "celery <test_custom_schedules.CheckedEveryTwentyMinutes object>" in listed
    assert "every 1d" not in listed
    assert "next check" in listed
    [row] = [r for r in json.loads(run("list", "reports", "--json")) if r["name"] == "sunrise"]
    assert (row["cadence"], row["kind"]) == (sunrise, "computed")
    assert "every_ms" not in row
    # The first check of a sunrise is the sunrise; the registry cannot know the next ones.
    nxt = json.loads(run("next", "reports", "sunrise", "--json"))
    assert [datetime.fromtimestamp(r["at_ms"] / MS, timezone.utc).hour for r in nxt] == [3]
    assert len(run("next", "reports", "sunrise").splitlines()) == 1
    assert sunrise in run("show", "reports", "sunrise")


def test_a_schedule_class_with_neither_method_is_refused() -> None:
    class Nothing(BaseSchedule):
        pass

    with pytest.raises(ConfigError, match="defines neither is_due nor remaining_estimate"):
        convert_schedule(Nothing(), Celery("x", set_as_current=False), "beat_schedule['x']")


@pytest.mark.parametrize(
    ("answer", "next_check_s"),
    [
        (schedstate(False, 12.3), 12.3),
        (schedstate(False, timedelta(minutes=2)), 120),
        (schedstate(False, None), 300),  # Celery's beat waits its max interval
        (schedstate(False, float("nan")), 300),
        (schedstate(False, 0), 0.01),  # not a busy loop
        (schedstate(False, 10**12), 366 * 86_400),
        (schedstate(True, 0), 1),  # always due: at most once a second
    ],
)
def test_the_second_value_of_is_due_is_the_next_check(answer: Any, next_check_s: float) -> None:
    class Fixed(BaseSchedule):
        def is_due(self, last_run_at: datetime) -> Any:
            return answer

    cadence = convert_schedule(Fixed(), Celery("x", set_as_current=False), "x")
    assert isinstance(cadence, CelerySchedule)
    now = ms(START)
    assert cadence.check(now - 60_000, now) == (answer[0], now + round(next_check_s * MS))


def test_a_custom_entry_whose_record_was_given_a_real_cadence_keeps_that_cadence() -> None:
    app = Celery("x", set_as_current=False)
    app.conf.update(
        beat_schedule={"sun": {"task": "t.record", "schedule": solar("sunset", 48.85, 2.35)}},
        result_expires=None,
        emq_bridge_check_tasks=False,
    )
    plan = app_schedule(app)
    queue = plan.declarations[0].queue
    placeholder = Every(86_400_000, "schedule")  # as stored (version 1's, kept)
    assert isinstance(plan.resolve_cadence(queue, "sun", placeholder), CelerySchedule)
    assert plan.resolve_cadence(queue, "sun", Every(60_000)) == Every(60_000)
    daily = Every(86_400_000)  # a real daily interval on the grid, not the placeholder
    assert plan.resolve_cadence(queue, "sun", daily) == daily
    assert plan.resolve_cadence(queue, "other", placeholder) is placeholder


class EveryOtherWholeSecond(BaseSchedule):
    """`remaining_estimate` only: the next even second after the last run's second."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        base = last_run_at.replace(microsecond=0) + timedelta(seconds=1)
        return base + timedelta(seconds=base.second % 2) - self.now()


@pytest.mark.parametrize("by_is_due", [True, False], ids=["is_due", "remaining_estimate"])
def test_a_check_named_for_an_instant_lands_on_that_ms_at_any_now(by_is_due: bool) -> None:
    # 2.047 s is 2047.0000000000002 ms as a float: rounded up, the check came a ms late.
    class Both(EveryOtherWholeSecond):
        def is_due(self, last_run_at: datetime) -> schedstate:
            remaining = self.remaining_estimate(last_run_at).total_seconds()
            return schedstate(remaining <= 0, max(remaining, 0))

    schedule_class = Both if by_is_due else EveryOtherWholeSecond
    cadence = convert_schedule(schedule_class(), Celery("x", set_as_current=False), "x")
    assert isinstance(cadence, CelerySchedule) and cadence.by_is_due is by_is_due
    last = ms(START) + 2 * MS + 953  # the next even second is 4 s on
    nows = range(last - MS, last)  # a pump whose clock trails the last run's: 1.047..2.047 s
    late = [now for now in nows if cadence.check(last, now)[1] != ms(START) + 4 * MS]
    assert late == []


@pytest.mark.parametrize(
    "make",
    [
        lambda nowfun: crontab(minute="*/2", nowfun=nowfun),
        lambda nowfun: schedule(timedelta(minutes=2), nowfun=nowfun),
    ],
    ids=["crontab", "schedule"],
)
def test_a_schedule_with_a_nowfun_of_its_own_is_checked_by_that_clock(make: Any) -> None:
    # Before: `crontab(..., nowfun=...)` became a plain cron expression and fired on the
    # pump's clock (a shifted nowfun's odd minutes fired on even ones), as Celery does not.
    shift = timedelta(minutes=1)
    clock: dict[str, datetime] = {}
    value = make(lambda: clock["now"] + shift)
    app = Celery("x", set_as_current=False, timezone="UTC")
    cadence = convert_schedule(value, app, "x")
    assert isinstance(cadence, CelerySchedule)
    last_run = datetime(2030, 1, 1, 10, 0, tzinfo=timezone.utc)
    clock["now"] = last_run
    # Celery's beat: the entry ran at `last_run`, so its `last_run_at` is what its schedule's
    # clock showed then (`ScheduleEntry.default_now()`: 10:01), not the pump's 10:00.
    entry = ScheduleEntry(name="x", task="t", schedule=value, app=app)
    assert entry.last_run_at == last_run + shift
    for minutes in (0.5, 1.2, 2.5, 3.5):
        clock["now"] = last_run + timedelta(minutes=minutes)
        celery_due = bool(entry.is_due()[0])  # Celery's beat, the same instant
        ours = cadence.check(ms(last_run), ms(clock["now"]))[0]
        assert ours == celery_due, minutes
    assert value.nowfun is not None  # the check left the schedule's own clock in place
