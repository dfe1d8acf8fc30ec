"""Schedules whose next slot is far from now, for tests that run on the real clock.

Intervals are aligned to the epoch grid: `every="1h"` fires at each top of the UTC hour.
A test that declares one against the real clock (a real pump, beat or worker) and counts
what fired sees one occurrence more whenever the grid's slot passes while it runs. These
helpers place the slots half a period (an interval) or half a day (a cron's hour) away.
"""

from __future__ import annotations

import time
from datetime import datetime
from zoneinfo import ZoneInfo

from emq_bridge.cadence import parse_every


def quiet_offset(every: str = "1h", now_ms: int | None = None) -> str:
    """Return the grid `offset` of interval `every` whose next slot is half a period after
    `now_ms` (default: now), in whole seconds ("1234s"), as every declaration form takes it."""
    period = parse_every(every)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    seconds = (now + period // 2) % period // 1000
    # A zero offset must be given as 0 or left out ("0s" is refused): one second later does.
    return f"{max(seconds, 1)}s"


def quiet_hour(tz: str = "UTC") -> int:
    """Return the hour of the day, in `tz`, about twelve hours from now."""
    return (datetime.now(ZoneInfo(tz)).hour + 12) % 24


def quiet_zone(hour: int) -> str:
    """Return a fixed-offset zone (`Etc/GMT...`) in which `hour` o'clock is about twelve hours
    from now: for a crontab a test does not declare (Celery's `celery.backend_cleanup`)."""
    shift = (hour + 12 - datetime.now(ZoneInfo("UTC")).hour) % 24  # local = UTC + shift
    if shift > 12:
        shift -= 24
    # POSIX signs: Etc/GMT-5 is UTC+5.
    return "UTC" if shift == 0 else f"Etc/GMT{-shift:+d}"
