"""Exact conversions between `timedelta`/`datetime` and integer milliseconds.

`td.total_seconds() * 1000` goes through a float and lands a hair off: 1.001 s gives
1000.9999999999999, so `int()` makes it 1000 ms and `math.ceil()` of 2.047 s makes 2048.
These divide the exact microseconds instead. The other way, `datetime.fromtimestamp(ms /
1000)` is a float too, which past year 2200 or so cannot hold every ms (3000-01-01T00:00:00.001
comes back .000): `utc_datetime` adds whole ms to the epoch.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from .errors import ScheduleError

__all__ = ["ceil_ms", "floor_ms", "instant_ms", "iso_utc", "utc_datetime"]

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


def utc_datetime(ms: int) -> datetime:
    """Return epoch ms as an aware UTC `datetime`, exactly; `OverflowError` outside years
    1 to 9999."""
    return _EPOCH + ms * _MS


def iso_utc(ms: int, *, always_ms: bool = False) -> str:
    """Return epoch ms as ISO 8601 UTC with a `Z`: `2026-03-29T01:00:00Z`, to the ms when
    it has any (`...00.250Z`), or always to the ms with `always_ms` (what a file writes)."""
    spec = "milliseconds" if always_ms or ms % 1000 else "seconds"
    return utc_datetime(ms).isoformat(timespec=spec).replace("+00:00", "Z")
