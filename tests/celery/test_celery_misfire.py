"""Misfire policies through Celery: `beat_schedule` entry keys, `@recurring`, Celery's own
`beat_cron_starting_deadline` (the catch-up window of crontab entries), a real beat
(`RepeatScheduler`) sending after an outage, and Celery 5.7's `crontab.is_due` through the
repeated fall-back hour, held against emq-bridge's cron."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import celery
import pytest
import redis
from celery import Celery
from celery.schedules import crontab

from emq_bridge import Cron
from emq_bridge.celery import RepeatScheduler, app_schedule, recurring
from emq_bridge.celery.entries import convert_entry
from emq_bridge.errors import ConfigError
from emq_bridge.testing import ManualClock

PARIS = ZoneInfo("Europe/Paris")
HOUR = 3_600_000


def record(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Any]:
    apps: list[Celery] = []

    def build(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
        app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            timezone="Europe/Paris",
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule=beat_schedule or {},
            result_backend=None,
            result_expires=None,
        )
        app.conf.update(conf)
        app.task(name="t.record", shared=False)(record)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def declared(app: Celery) -> dict[str, Any]:
    return {d.name: d.definition for d in app_schedule(app).declarations}


def test_beat_schedule_entries_take_the_misfire_keys(make_app: Any) -> None:
    app = make_app(
        {
            "etl": {
                "task": "t.record",
                "schedule": 3600.0,
                "misfire": "all",
                "catchup_window": "1d",
                "catchup_max": 24,
            },
            "report": {"task": "t.record", "schedule": crontab(0, 6), "misfire": "earliest"},
            "plain": {"task": "t.record", "schedule": 60.0},
        }
    )
    found = declared(app)
    assert (found["etl"].misfire, found["etl"].catchup_window_ms) == ("all", 86_400_000)
    assert found["etl"].catchup_max == 24
    assert (found["report"].misfire, found["report"].catchup_window_ms) == ("earliest", None)
    assert (found["plain"].misfire, found["plain"].catchup_window_ms) == ("coalesce", None)


def test_beat_cron_starting_deadline_is_the_window_of_crontab_entries_only(
    make_app: Any,
) -> None:
    app = make_app(
        {
            "nightly": {"task": "t.record", "schedule": crontab(30, 2)},
            "own": {"task": "t.record", "schedule": crontab(0, 3), "catchup_window": 60},
            "interval": {"task": "t.record", "schedule": 60.0},
        },
        beat_cron_starting_deadline=600,
    )
    found = declared(app)
    assert found["nightly"].catchup_window_ms == 600_000  # Celery's setting, in ms
    assert found["own"].catchup_window_ms == 60_000  # the entry's own wins
    assert found["interval"].catchup_window_ms is None  # Celery applies it to crontabs only


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"misfire": "oldest"}, "misfire must be one of"),
        ({"catchup_max": 3}, "catchup_max applies to misfire='all' only"),
        ({"catchup_window": "soon"}, "catchup_window 'soon' is not an interval"),
    ],
)
def test_a_bad_misfire_key_is_a_config_error_naming_the_entry(
    make_app: Any, entry: dict[str, Any], message: str
) -> None:
    app = make_app()
    raw = {"task": "t.record", "schedule": 60.0, **entry}
    with pytest.raises(ConfigError, match=rf"beat_schedule\['bad'\]: .*{message}"):
        convert_entry(app, "bad", raw)


def test_the_recurring_decorator_takes_the_policies(make_app: Any) -> None:
    app = make_app()

    @recurring(every="1h", misfire="skip", catchup_window=120, name="poll")
    @app.task(name="t.poll", shared=False)  # type: ignore[untyped-decorator]
    def poll() -> None: ...

    definition = declared(app)["poll"]
    assert (definition.misfire, definition.catchup_window_ms) == ("skip", 120_000)


def broker_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    found = []
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        found += [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]
    return found


def test_a_beat_back_from_an_outage_sends_what_the_starting_deadline_allows(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    """Two crontabs at :00; the beat is down 3 h 5 min. With a 10-minute deadline the hourly
    one (its last slot 5 min ago) is sent once, for that slot; the daily one's only slot
    is 3 h old, past the deadline: nothing is sent, its next run is tomorrow."""
    app = make_app(
        {
            "hourly": {"task": "t.record", "schedule": crontab(minute=0)},
            "daily": {"task": "t.record", "schedule": crontab(minute=0, hour=0)},
        },
        beat_cron_starting_deadline=600,
    )
    scheduler = RepeatScheduler(app)
    assert scheduler.pump is not None
    repeat = scheduler.pump.repeat
    day = datetime(2030, 6, 1, tzinfo=PARIS)
    clock = ManualClock(day - timedelta(minutes=1))
    scheduler.pump.clock = clock
    for name in ("hourly", "daily"):  # as if registered before the outage
        repeat.client.zadd(repeat.keys(f"{prefix}-q").registry, {name: int(day.timestamp() * 1000)})
    clock.set(day + timedelta(hours=3, minutes=5))
    scheduler.tick()
    messages = broker_messages(client, f"{prefix}-q")
    assert [(m["headers"]["emq_schedule"], m["headers"]["emq_due_ms"]) for m in messages] == [
        (f"{prefix}-q/hourly", int((day + timedelta(hours=3)).timestamp() * 1000))
    ]
    hourly, daily = (repeat.get(f"{prefix}-q", n) for n in ("hourly", "daily"))
    assert hourly is not None and daily is not None
    assert (hourly.missed, daily.missed) == (3, 1)
    assert daily.next_run_ms == int((day + timedelta(days=1)).timestamp() * 1000)
    scheduler.close()


# -- Celery's crontab.is_due through the repeated fall-back hour ---------------------------

FALL_BACK = datetime(2025, 10, 26, 1, 0, tzinfo=timezone.utc)  # 03:00 CEST -> 02:00 CET


def celery_beat_sends(
    entry: crontab, last_run: datetime, start: datetime, end: datetime, tick: timedelta
) -> list[tuple[datetime, float]]:
    """Drive Celery's own `is_due` as its beat does: check every `tick`, and when due, send
    and make `now` the last run (`Scheduler.reserve`). Return (send instant, next check s)."""
    now = [start]
    entry.nowfun = lambda: now[0].astimezone(PARIS)
    sends = []
    while now[0] <= end:
        due, next_check = entry.is_due(last_run.astimezone(PARIS))
        if due:
            sends.append((now[0], next_check))
            last_run = now[0]
        now[0] += tick
    return sends


def test_celery_57_sends_a_crontab_due_later_in_the_repeated_hour_on_every_tick() -> None:
    """A beat (re)started at 02:10 CET, in the repeated hour (a deploy, a crash, a new
    entry: its last run is then `now`), with `crontab(minute=30, hour=2)`: Celery 5.7 says
    due at every check until the wall clock passes 02:30 CET, each time naming 0 s as the
    next check (its `ffwd` addition to the last run drops `fold`, so the next run it computes
    is 02:30 CEST, an hour in the past). emq-bridge fires 02:30 once that day."""
    assert celery.__version__.startswith("5.7")
    app = Celery("fold", set_as_current=False)
    app.conf.update(timezone="Europe/Paris", enable_utc=True)
    entry = crontab(minute=30, hour=2, app=app)
    restart = FALL_BACK + timedelta(minutes=10)  # 02:10 CET (01:10 UTC)
    second_0230 = FALL_BACK + timedelta(minutes=30)  # 02:30 CET
    sends = celery_beat_sends(
        entry, restart, restart + timedelta(minutes=1), FALL_BACK + timedelta(hours=2),
        timedelta(minutes=1),
    )  # fmt: skip
    instants = [s for s, _ in sends]
    # Due at every one-minute check from 02:11 to 02:30 CET: 20 sends in 20 minutes.
    assert instants == [restart + timedelta(minutes=k) for k in range(1, 21)]
    assert instants[-1] == second_0230
    assert {check for _, check in sends[:-1]} == {0}  # "check again at once"
    # emq-bridge: the same day, 02:30 fires once, at its first occurrence (02:30 CEST).
    cron = Cron("30 2 * * *", "Europe/Paris")
    at = int((FALL_BACK - timedelta(hours=4)).timestamp() * 1000)
    fires = []
    while (at := cron.next_after(at)) <= int((FALL_BACK + timedelta(hours=2)).timestamp() * 1000):
        fires.append(at)
    assert fires == [int((FALL_BACK - timedelta(minutes=30)).timestamp() * 1000)]  # 00:30 UTC
    # ... and a registration made at 02:10 CET does not fire again until the next day.
    made = int(restart.timestamp() * 1000)
    assert cron.first_run(made) == int(
        datetime(2025, 10, 27, 2, 30, tzinfo=PARIS).timestamp() * 1000
    )


def test_celery_57_running_through_the_night_sends_the_fixed_time_once() -> None:
    """The every-tick sends need a last run inside the repeated hour: a beat that ran all
    night sends `30 2 * * *` once, as emq-bridge does."""
    app = Celery("fold", set_as_current=False)
    app.conf.update(timezone="Europe/Paris", enable_utc=True)
    entry = crontab(minute=30, hour=2, app=app)
    day_before = FALL_BACK - timedelta(days=1, minutes=30)  # 02:30 CEST the day before
    sends = celery_beat_sends(
        entry, day_before, FALL_BACK - timedelta(hours=2), FALL_BACK + timedelta(hours=2),
        timedelta(minutes=1),
    )  # fmt: skip
    assert [s for s, _ in sends] == [FALL_BACK - timedelta(minutes=30)]
