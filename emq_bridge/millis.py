"""Exact conversions of `timedelta` and `datetime` to integer milliseconds.

`td.total_seconds() * 1000` goes through a float and lands a hair off: 1.001 s gives
1000.9999999999999, so `int()` makes it 1000 ms and `math.ceil()` of 2.047 s makes 2048.
These divide the exact microseconds instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from .errors import ScheduleError

_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def floor_ms(delta: timedelta) -> int:
    """Return `delta` in whole ms, rounded down (a partial ms is dropped)."""
    return delta // _MS


def ceil_ms(delta: timedelta) -> int:
    """Return `delta` in whole ms, rounded up (a partial ms counts as one)."""
    return -(-delta // _MS)


def instant_ms(value: datetime, *, ceil: bool = False) -> int:
    """Return an aware `datetime` as epoch ms, rounded down unless `ceil`.

    A naive one raises `ScheduleError`: which instant it names depends on a zone it does not
    say (the host's, as `datetime.timestamp` would read it), as `bounds.epoch_ms` refuses it.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"{value.isoformat()} has no time zone, so it names no instant; give a tzinfo "
            "such as timezone.utc or ZoneInfo('Europe/Paris')"
        )
    since = value - _EPOCH
    return ceil_ms(since) if ceil else floor_ms(since)
