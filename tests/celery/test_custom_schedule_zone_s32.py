"""Custom Celery schedules see the datetimes Celery's beat gives them (session 32's beat probe).

1. Celery's beat gives `is_due` its `last_run_at` and `now()` in the app's time zone
   (`app.now()`, `ScheduleEntry.default_now()`); emq-bridge gave both in UTC. An `is_due`
   reading `self.now().hour` as the app's hour never fired under `celery beat -S emq`, and
   `schedule(timedelta(days=1), relative=True)` ran at UTC midnight, not the app's.
2. A custom schedule whose `is_due` raised when its entry was first synced stopped the beat
   ("emq-bridge beat refuses to start: ... could not sync its schedules", no entry named):
   every other entry stopped with it. Celery's beat logs the entry and tries again later;
   the beat now parks that entry, as it parks one whose later check raises, and goes on.
3. A schedule with a `nowfun` of its own: a new entry's last run is that clock's `now()`, as
   `ScheduleEntry.default_now()` makes it, not the pump's clock (a clock 30 s ahead made a
   new hourly crontab fire at once under emq-bridge, where Celery's beat waits the hour).

Each offline case holds Celery's own `ScheduleEntry` and emq-bridge's `CelerySchedule` to the
same schedule object on the same instants; the real `celery beat -S emq` process covers 1
and 2 end to end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedstate, schedule
from processes import wait_until

from emq_bridge import Repeat
from emq_bridge.celery.entries import CelerySchedule, convert_schedule

pytestmark = [pytest.mark.timeout(150)]

MS = 1000
# (app timezone, enable_utc): Celery's `app.now()` is in the zone either way.
ZONES = [("Europe/Paris", True), ("Europe/Paris", False), ("America/New_York", True)]


def ms(at: datetime) -> int:
    return int(at.timestamp() * MS)


def make_app(zone: str, enable_utc: bool) -> Celery:
    app = Celery("zones", set_as_current=False)
    app.conf.update(timezone=zone, enable_utc=enable_utc)
    return app


class Spy(schedule):  # type: ignore[misc]
    """Celery's interval schedule, recording the `last_run_at` and `now()` it is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[datetime, datetime]] = []

    def is_due(self, last_run_at: datetime) -> schedstate:
        self.seen.append((last_run_at, self.now()))
        return super().is_due(last_run_at)

    def __repr__(self) -> str:
        return "<Spy>"


def as_ms(at: datetime) -> str:
    """`at` to the ms, with its offset: what both beats must agree on."""
    return at.isoformat(timespec="milliseconds")


def emq_sees(spy: Spy, app: Celery, last_run: datetime, now: datetime) -> tuple[datetime, ...]:
    cadence = convert_schedule(spy, app, "beat_schedule['spy']")
    assert isinstance(cadence, CelerySchedule)
    spy.seen.clear()
    cadence.check(ms(last_run), ms(now))
    return spy.seen[0]


@pytest.mark.parametrize(("zone", "enable_utc"), ZONES)
def test_is_due_gets_last_run_at_and_now_in_the_apps_zone_as_celerys_beat_gives_them(
    zone: str, enable_utc: bool
) -> None:
    app = make_app(zone, enable_utc)
    spy = Spy(timedelta(seconds=3), app=app)
    entry = ScheduleEntry(name="spy", task="t", schedule=spy, app=app)  # Celery's new entry
    entry.is_due()
    celery_last, celery_now = spy.seen[0]
    assert celery_now.utcoffset() == datetime.now(ZoneInfo(zone)).utcoffset()
    # The same instants through emq-bridge's check: the same datetimes, the same zone.
    emq_last, emq_now = emq_sees(spy, app, celery_last, celery_now)
    assert (as_ms(emq_last), as_ms(emq_now)) == (as_ms(celery_last), as_ms(celery_now))
    assert (emq_last.hour, emq_now.hour) == (celery_last.hour, celery_now.hour)
    assert emq_now.tzinfo == celery_now.tzinfo == app.timezone
    # A run an hour ago is shown in the app's zone too (Celery's beat kept `now()` then).
    earlier = celery_now - timedelta(hours=1)
    emq_last, _ = emq_sees(spy, app, earlier, celery_now)
    assert as_ms(emq_last) == as_ms(earlier.astimezone(app.timezone))


@pytest.mark.parametrize(("zone", "enable_utc"), ZONES)
def test_a_relative_daily_schedule_runs_at_the_apps_midnight(zone: str, enable_utc: bool) -> None:
    app = make_app(zone, enable_utc)
    daily = schedule(timedelta(days=1), relative=True, app=app)
    entry = ScheduleEntry(name="daily", task="t", schedule=daily, app=app)
    due, next_s = entry.is_due()
    started = entry.last_run_at
    midnight = datetime.combine(
        started.astimezone(ZoneInfo(zone)).date() + timedelta(days=1),
        datetime.min.time(),
        ZoneInfo(zone),
    )
    assert not due and abs(started + timedelta(seconds=next_s) - midnight) < timedelta(seconds=1)
    cadence = convert_schedule(schedule(timedelta(days=1), relative=True), app, "x")
    assert cadence.first_run(ms(started)) == ms(midnight)  # UTC midnight before


def shifted(real: datetime, by: timedelta) -> Any:
    return lambda: real + by


@pytest.mark.parametrize(
    "make",
    [
        lambda nowfun: crontab(minute=0, hour="*", nowfun=nowfun),
        lambda nowfun: schedule(timedelta(minutes=5), relative=True, nowfun=nowfun),
    ],
    ids=["crontab", "relative-schedule"],
)
def test_a_new_entrys_last_run_is_its_own_clocks_now_as_celerys_default_now(make: Any) -> None:
    real = datetime(2030, 1, 1, 2, 59, 45, tzinfo=timezone.utc)  # the clock at the deploy
    app = make_app("UTC", True)
    celery_value = make(shifted(real, timedelta(seconds=30)))  # its own clock: 03:00:15
    due, next_s = ScheduleEntry(name="n", task="t", schedule=celery_value, app=app).is_due()
    assert (due, next_s) == (False, 3585 if isinstance(celery_value, crontab) else 285)
    cadence = convert_schedule(make(shifted(real, timedelta(seconds=30))), app, "x")
    # Before: last run = the pump's 02:59:45, before the slot of 03:00: fired at once.
    assert cadence.first_run(ms(real)) == ms(real) + round(next_s * MS)


def test_a_zoned_nowfun_sees_its_last_run_in_its_own_zone() -> None:
    # django-celery-beat's TzAwareCrontab style: a clock of its own in another zone.
    kolkata = ZoneInfo("Asia/Kolkata")
    app = make_app("Europe/Paris", True)
    spy = Spy(timedelta(minutes=1), nowfun=lambda: datetime.now(kolkata), app=app)
    ScheduleEntry(name="spy", task="t", schedule=spy, app=app).is_due()
    celery_last, _ = spy.seen[0]
    assert celery_last.tzinfo == kolkata
    now = datetime.now(timezone.utc)
    emq_last, emq_now = emq_sees(spy, app, now - timedelta(minutes=5), now)
    assert emq_last.tzinfo == emq_now.tzinfo == kolkata
    assert abs(emq_last - (now - timedelta(minutes=5))) < timedelta(seconds=1)


APP = textwrap.dedent("""
    import os
    from datetime import timedelta

    from celery import Celery
    from celery.schedules import schedule

    env = os.environ
    app = Celery("zs", broker=env["ZS_BROKER"])


    class flaky(schedule):
        \"\"\"Every N s; its is_due always raises (a bug, an outage in the user's code).\"\"\"

        def __init__(self, n):
            self.n = n
            super().__init__(timedelta(seconds=n))

        def is_due(self, last_run_at):
            raise RuntimeError("flaky is_due failed")

        def __repr__(self):
            return f"<flaky {self.n}>"


    class app_hours_only(schedule):
        \"\"\"Every N s, while the hour `now()` shows (the app's zone) is one of `hours`.\"\"\"

        def __init__(self, n, hours):
            self.n, self.hours = n, hours
            super().__init__(timedelta(seconds=n))

        def is_due(self, last_run_at):
            due, nxt = super().is_due(last_run_at)
            return (due and self.now().hour in self.hours, nxt)

        def __repr__(self):
            return f"<app_hours_only {self.n} {sorted(self.hours)}>"


    hour = int(env["ZS_HOUR"])
    app.conf.update(
        timezone="Europe/Paris",
        enable_utc=False,
        emq_bridge_prefix=env["ZS_PREFIX"],
        task_default_queue=env["ZS_QUEUE"],
        result_backend=None,
        result_expires=None,
        beat_schedule={
            "flaky": {"task": "zs.flaky", "schedule": flaky(1)},
            "gate": {"task": "zs.gate", "schedule": app_hours_only(1, {hour, (hour + 1) % 24})},
            "ctl": {"task": "zs.ctl", "schedule": 1.0},
        },
    )


    @app.task(name="zs.flaky")
    def flaky_task():
        pass


    @app.task(name="zs.gate")
    def gate():
        pass


    @app.task(name="zs.ctl")
    def ctl():
        pass
""")


def sent(client: redis.Redis, queue: str) -> list[str]:
    """The task names the beat pushed onto `queue` in the broker (no worker takes them)."""
    return [json.loads(raw)["headers"]["task"] for raw in client.lrange(queue, 0, -1)]


def test_celery_beat_parks_an_entry_whose_first_check_raises_and_fires_by_the_apps_hour(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "zs_app.py").write_text(APP)
    queue = f"{prefix}-q"
    log = tmp_path / "beat.log"
    # The Paris hour now: under UTC datetimes the gate saw an hour 1-2 h behind, never these.
    hour = datetime.now(ZoneInfo("Europe/Paris")).hour
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "ZS_BROKER": redis_url,
        "ZS_PREFIX": prefix,
        "ZS_QUEUE": queue,
        "ZS_HOUR": str(hour),
    }
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "zs_app", "beat", "-S", "emq"),
                *("--pidfile=", f"--schedule={tmp_path / 'beat.db'}", "-l", "info"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def output() -> str:
        return log.read_text(errors="replace")

    try:

        def fired() -> bool:
            assert beat.poll() is None, output()[-3000:]
            names = sent(client, queue)
            return names.count("zs.ctl") >= 3 and names.count("zs.gate") >= 3

        wait_until(fired, 60, "the beat's sends of ctl and gate", then=output)
        repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
        flaky = repeat.get(queue, "flaky")
        assert flaky is not None and flaky.next_run_ms is not None  # written, checked later
        assert flaky.next_run_ms - ms(datetime.now(timezone.utc)) > 45 * MS, flaky
        repeat.client.close()
        assert "zs.flaky" not in sent(client, queue)
        assert beat.poll() is None
    finally:
        if beat.poll() is None:
            beat.send_signal(signal.SIGTERM)
            try:
                beat.wait(timeout=20)
            except subprocess.TimeoutExpired:
                beat.kill()
                beat.wait()
        client.delete(queue)
    text = output()
    assert "refuses to start" not in text, text[-3000:]
    parked = [line for line in text.splitlines() if f"{queue}/flaky: parked for 60s" in line]
    assert len(parked) == 1, text[-3000:]
    assert "ERROR" in parked[0], parked
    assert parked[0].endswith(
        "its next run cannot be computed: RuntimeError('flaky is_due failed')"
    ), parked
