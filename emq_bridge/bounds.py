"""Bounds of a registration: when its slots may start and end, and how many may run.

Pure values and math, no I/O. What they mean:

* `start_ms`: no occurrence before it; the first run is the cadence's first slot at or
  after it (for `anchor="release"`/`"schedule"`, which have no fixed slots, `start_ms`
  itself).
* `end_ms`: no occurrence after it (inclusive, as Temporal's and BullMQ's end dates).
* `limit`: at most this many runs. The registry keeps a `remaining` counter outside the
  digest, decremented in the claim that fires a slot (triggers do not consume it).
* `immediately`: the first run is the registration instant itself (BullMQ's
  `immediately`), then the cadence's slots.

Past its last slot a registration is *completed*: its member stays in the registry at
`+inf` and its record says why (`completed`: `end_at`, `limit` or `at`). The moves that
write a score decide it in Lua from the record (`lua/claim.lua`, `upsert.lua`,
`register.lua`, `resume.lua`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

from .cadence import LATEST_MS, NEVER_MS, At, Cadence, Every, next_runs
from .calendars import Excluding
from .errors import ScheduleError
from .jitter import Jittered, base_cadence
from .millis import ceil_ms, floor_ms

__all__ = [
    "COMPLETED_REASONS",
    "MAX_LIMIT",
    "Bounds",
    "Completed",
    "bounded_runs",
    "epoch_ms",
    "instants_ms",
]

Completed = Literal["end_at", "limit", "at"]
COMPLETED_REASONS: tuple[Completed, ...] = ("end_at", "limit", "at")
# The bound of `limit`: a larger one is a typo (and stays exact in Lua's doubles).
MAX_LIMIT = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)

Instant = datetime | str


def epoch_ms(value: object, field: str, *, ceil: bool = False) -> int:
    """Return an aware `datetime` (or an ISO 8601 string with an offset) as epoch ms, from
    1970 to the end of 9999 (`LATEST_MS`).

    A naive time is refused: which instant it names depends on a zone it does not say.
    A partial ms is dropped, or with `ceil` counted as one: an instant something may start
    at (`start_at`, `at`) rounds up, so nothing runs before it; an end rounds down.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" else text)
        except ValueError:
            raise ScheduleError(
                f"{field} {text[:80]!r} is not an ISO 8601 date and time "
                "(e.g. '2026-03-29T09:00:00+02:00')"
            ) from None
    if not isinstance(value, datetime):
        raise ScheduleError(
            f"{field} must be a datetime or an ISO 8601 string, got {type(value).__name__}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"{field} {value.isoformat()} has no time zone; give an offset "
            "('+02:00', 'Z') or a tzinfo such as ZoneInfo('Europe/Paris')"
        )
    ms = ceil_ms(value - _EPOCH) if ceil else floor_ms(value - _EPOCH)
    if not 0 <= ms <= LATEST_MS:  # first: the check below cannot leave datetime's years
        raise ScheduleError(f"{field} {value.isoformat()} is before 1970 or after 9999")
    wall = value.replace(tzinfo=None)
    if value.astimezone(timezone.utc).astimezone(value.tzinfo).replace(tzinfo=None) != wall:
        raise ScheduleError(
            f"{field} {wall.isoformat()} does not exist in {value.tzinfo} (a clock change "
            "skips it); give the instant after the change"
        )
    return ms


def instants_ms(value: Instant | Iterable[Instant]) -> tuple[int, ...]:
    """Return one instant or a list of them (`at=`) as sorted, distinct epoch ms."""
    if isinstance(value, datetime | str):
        values: list[object] = [value]
    elif isinstance(value, Iterable):
        values = list(value)
    else:  # epoch_ms names what it takes
        values = [value]
    return tuple(sorted({epoch_ms(v, "at", ceil=True) for v in values}))


def _optional_ms(fields: Mapping[str, str], key: str) -> int | None:
    raw = fields.get(key)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ScheduleError(f"{key} {raw[:40]!r} is not epoch ms") from None


@dataclass(frozen=True, slots=True)
class Bounds:
    """When a registration's slots start and end, how many run, and a first run at once.

    The defaults bound nothing and add no record field, so the digest of a definition
    without bounds is the one it had before bounds existed.
    """

    start_ms: int | None = None
    end_ms: int | None = None
    limit: int | None = None
    immediately: bool = False

    def __post_init__(self) -> None:
        for name in ("start_ms", "end_ms"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LATEST_MS
            ):
                raise ScheduleError(
                    f"{name} must be epoch ms from 0 (1970) to {LATEST_MS} (9999), got {value!r}"
                )
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise ScheduleError(
                f"end_at ({_iso(self.end_ms)}) is before start_at ({_iso(self.start_ms)})"
            )
        limit = self.limit
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT
        ):
            raise ScheduleError(
                f"limit must be a whole number of runs from 1 to {MAX_LIMIT}, got {limit!r}"
            )
        if not isinstance(self.immediately, bool):
            raise ScheduleError(f"immediately must be true or false, got {self.immediately!r}")

    @property
    def empty(self) -> bool:
        return self == _NONE

    def check(self, cadence: Cadence) -> None:
        """Raise `ScheduleError` if these bounds do not apply to `cadence`."""
        if self.immediately and isinstance(cadence, At):
            raise ScheduleError("immediately does not apply to at=; add the instant to at")
        start = self.start_ms
        if (
            start is not None
            and not isinstance(base_cadence(cadence), At)  # past its last instant: completed
            and not hasattr(cadence, "check")  # a check decided by user code: not asked here
            and self.first_run(cadence, start - 1) >= NEVER_MS
        ):
            raise ScheduleError(
                f"{cadence.describe()} has no run from start_at ({_iso(start)}) to the end "
                "of year 9999"
            )

    def to_fields(self) -> dict[str, str]:
        """Return the record fields (part of the digest); none for the defaults."""
        fields = self.when_fields()
        if self.limit is not None:
            fields["limit"] = str(self.limit)
        if self.immediately:
            fields["immediately"] = "1"
        return fields

    def when_fields(self) -> dict[str, str]:
        """Return the fields that move slots (part of the cadence digest): start and end."""
        fields = {}
        if self.start_ms is not None:
            fields["start_ms"] = str(self.start_ms)
        if self.end_ms is not None:
            fields["end_ms"] = str(self.end_ms)
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Bounds:
        """Read the bounds of a record; `ScheduleError` if they are corrupt."""
        if not any(map(fields.get, _FIELDS)):  # most records: no bounds, one shared value
            return _NONE
        limit = _optional_ms(fields, "limit")
        return cls(
            _optional_ms(fields, "start_ms"),
            _optional_ms(fields, "end_ms"),
            limit,
            fields.get("immediately") == "1",
        )

    def first_run(self, cadence: Cadence, now_ms: int, *, created: bool = True) -> int:
        """Return the first run of a registration written at `now_ms`.

        `created=False` is a changed definition of an existing registration: `immediately`
        does not fire again, and the cadence's grid is kept (no re-anchoring on `now_ms`).
        The result may be past `end_ms` (or `NEVER_MS`): the writing move then completes it.
        """
        start = self.start_ms
        # `immediately` fires at once, but not at an instant the exclusions cover: then the
        # first slot comes as without it.
        immediately = self.immediately and created
        if start is not None and start > now_ms:
            if immediately and not _excluded(cadence, start):
                return start
            if isinstance(cadence, Every) and cadence.anchor != "grid":
                return start  # no fixed slots: the start is the first release
            if isinstance(cadence, Jittered):
                # The first slot at or after the start, sent at its jittered instant: the
                # jittered instant of a slot before the start may itself fall after it.
                return cadence.at(cadence.inner.next_after(start - 1))
            return cadence.next_after(start - 1)
        if immediately and not _excluded(cadence, now_ms):
            return now_ms
        return cadence.first_run(now_ms)

    def describe(self) -> str:
        """Return the bounds in words ('' for none)."""
        parts = []
        if self.start_ms is not None:
            parts.append(f"from {_iso(self.start_ms)}")
        if self.end_ms is not None:
            parts.append(f"until {_iso(self.end_ms)}")
        if self.limit is not None:
            parts.append(f"{self.limit} run{'s' if self.limit != 1 else ''}")
        if self.immediately:
            parts.append("immediately")
        return ", ".join(parts)


_NONE = Bounds()
# The record fields of bounds (`from_fields`).
_FIELDS = ("start_ms", "end_ms", "limit", "immediately")


def _iso(ms: int) -> str:
    spec = "milliseconds" if ms % 1000 else "seconds"
    return (_EPOCH + ms * _MS).isoformat(timespec=spec).replace("+00:00", "Z")


def _excluded(cadence: Cadence, instant_ms: int) -> bool:
    """True when `cadence`'s exclusions (under or over its jitter) cover `instant_ms`."""
    while isinstance(cadence, Jittered | Excluding):
        if isinstance(cadence, Excluding):
            return cadence.excluded_until(instant_ms) is not None
        cadence = cadence.inner
    return False


def last_instant(cadence: Cadence, bounds: Bounds) -> int | None:
    """Return the last instant a slot may have (end_ms, or the last `at`), or None."""
    ends = [e for e in (bounds.end_ms, getattr(cadence, "last_ms", None)) if e is not None]
    return min(ends) if ends else None


def bounded_runs(
    cadence: Cadence,
    bounds: Bounds,
    first_ms: int | None,
    n: int,
    *,
    remaining: int | None = None,
) -> list[int]:
    """Return up to `n` runs from `first_ms` (the stored next run), within the bounds.

    `remaining` is the registration's `remaining` counter when it has a `limit`.
    """
    if first_ms is None or n <= 0:
        return []
    if remaining is not None:
        n = min(n, max(0, remaining))
    runs = [first_ms, *next_runs(cadence, first_ms, n - 1)] if n else []
    last = last_instant(cadence, bounds)
    return [r for r in runs if r < NEVER_MS and (last is None or r <= last)]
