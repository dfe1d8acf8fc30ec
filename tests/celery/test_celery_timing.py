"""Aligned intervals, bounds and one-offs through Celery: `beat_schedule` entries and
`@recurring`, run by the real `RepeatScheduler` with a manual clock; what fired is read back
from the broker's own lists (each message's `emq_due_ms` header)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery

from emq_bridge.celery import RepeatScheduler, app_schedule, recurring
from emq_bridge.errors import ConfigError
from emq_bridge.testing import ManualClock

NEW_YORK = ZoneInfo("America/New_York")  # 2030-03-10 02:00 -> 03:00
MIN = 60_000


def record(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Any]:
    apps: list[Celery] = []

    def build(beat_schedule: dict[str, Any]) -> Celery:
        app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            timezone="America/New_York",
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule=beat_schedule,
            result_backend=None,
            result_expires=None,
        )
        app.task(name="t.record", shared=False)(record)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def sent(client: redis.Redis, queue: str) -> dict[str, list[int]]:
    """The nominal times of the task messages waiting in `queue`, by schedule name."""
    found: dict[str, list[int]] = {}
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        for raw in client.lrange(key, 0, -1):
            headers = json.loads(raw)["headers"]
            name = headers["emq_schedule"].split("/", 1)[1]
            found.setdefault(name, []).append(int(headers["emq_due_ms"]))
    return {name: sorted(dues) for name, dues in found.items()}


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def drive(scheduler: RepeatScheduler, start: int, end: int, step: int) -> None:
    assert scheduler.pump is not None
    clock = ManualClock(start)
    scheduler.pump.clock = clock
    while clock() <= end:
        scheduler.tick()
        clock.advance(step)


def test_beat_schedule_entries_take_offset_bounds_limit_and_one_off(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    start = datetime(2030, 3, 10, 1, 10, tzinfo=NEW_YORK)
    end = datetime(2030, 3, 10, 4, 0, tzinfo=NEW_YORK)  # EDT: 1 h 50 min of real time later
    app = make_app(
        {
            "window": {
                "task": "t.record",
                "schedule": 900.0,
                "offset": 300,
                "start_at": start,
                "end_at": end,
            },
            "limited": {
                "task": "t.record",
                "schedule": timedelta(hours=1),
                "limit": 2,
                "start_at": start,
            },
            "once": {"task": "t.record", "schedule": 3600.0, "one_off": True, "start_at": start},
            "clocked": {"task": "t.record", "at": [start, end]},
        }
    )
    scheduler = RepeatScheduler(app)
    drive(scheduler, ms(start) - 30 * MIN, ms(end) + 3 * 3_600_000, 4 * MIN)
    fired = sent(client, f"{prefix}-q")
    # Every 15 min from :05 UTC (the grid is UTC's; New York's clock change moves nothing).
    low, high = ms(start), ms(end)
    first = low + (-(low - 5 * MIN) % (15 * MIN))
    assert fired["window"] == list(range(first, high + 1, 15 * MIN))
    assert len(fired["window"]) == 7  # 06:20 to 07:50 UTC
    hour = 3_600_000
    assert fired["limited"] == [low - low % hour + hour, low - low % hour + 2 * hour]
    assert fired["once"] == fired["limited"][:1]  # one run, the first slot from the start
    assert fired["clocked"] == [low, high]
    repeat = scheduler.pump.repeat  # type: ignore[union-attr]
    states = {r.name: r.completed for r in repeat.list(f"{prefix}-q")}
    assert states == {"window": "end_at", "limited": "limit", "once": "limit", "clocked": "at"}
    scheduler.close()


def test_recurring_takes_one_offs_and_bounds(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    app = make_app({})
    at = [datetime(2030, 11, 3, 1, 30, tzinfo=NEW_YORK, fold=fold) for fold in (0, 1)]

    @recurring(at=at, name=f"launch-{prefix}")
    @app.task(name=f"t.{prefix}.launch", shared=False)
    def launch() -> None:
        return None

    @recurring(every="1h", offset="30m", end_at=at[1], limit=50, name=f"poll-{prefix}")
    @app.task(name=f"t.{prefix}.poll", shared=False)
    def poll() -> None:
        return None

    scheduler = RepeatScheduler(app)
    drive(scheduler, ms(at[0]) - 150 * MIN, ms(at[1]) + 60 * MIN, 10 * MIN)
    fired = sent(client, f"{prefix}-q")
    assert fired[f"launch-{prefix}"] == [ms(at[0]), ms(at[0]) + 3_600_000]  # 01:30 EDT, EST
    assert fired[f"poll-{prefix}"][-1] == ms(at[1])  # inclusive end, on the :30 grid
    repeat = scheduler.pump.repeat  # type: ignore[union-attr]
    assert repeat.get(f"{prefix}-q", f"launch-{prefix}").completed == "at"  # type: ignore[union-attr]
    assert repeat.get(f"{prefix}-q", f"poll-{prefix}").completed == "end_at"  # type: ignore[union-attr]
    scheduler.close()


def test_bad_bounds_in_a_beat_entry_are_config_errors(make_app: Any) -> None:
    bad = make_app({"x": {"task": "t.record", "schedule": 60.0, "end_at": datetime(2030, 1, 1)}})
    with pytest.raises(ConfigError, match=r"beat_schedule\['x'\].*no time zone"):
        app_schedule(bad)
    both = make_app({"x": {"task": "t.record", "schedule": 60.0, "one_off": True, "limit": 3}})
    with pytest.raises(ConfigError, match="one_off is limit 1"):
        app_schedule(both)
    offset = make_app({"x": {"task": "t.record", "schedule": 60.0, "offset": 90}})
    with pytest.raises(ConfigError, match="less than the interval"):
        app_schedule(offset)
    at = datetime(2030, 1, 1, tzinfo=NEW_YORK)
    twice = make_app({"x": {"task": "t.record", "schedule": 60.0, "at": at}})
    with pytest.raises(ConfigError, match="give 'schedule' or 'at'"):
        app_schedule(twice)
    naive = make_app({"x": {"task": "t.record", "at": [at, datetime(2030, 1, 2)]}})
    with pytest.raises(ConfigError, match=r"beat_schedule\['x'\].*no time zone"):
        app_schedule(naive)
