"""Cadences: pure next-run math in epoch milliseconds. No I/O, no clock.

Two kinds reduce to one epoch-ms score:

* `Every`: an interval. `anchor="schedule"` (the default) gives `next = due + every`, which
  is drift-free: a 15-minute job stays on :00/:15/:30/:45. `anchor="release"` gives
  `next = now + every`, EchoMQ's `advance/4` literally.
* `Cron`: a 5-field cron expression (or an `@alias`) evaluated in an IANA time zone.

Cron fields are matched by cronsim on naive wall times, and the DST rule below is applied
by `Cron` itself. cronsim was chosen over croniter by correctness (`tests/test_cadence.py`
holds both against a brute-force oracle): croniter fires a fixed time such as `30 2 * * *`
twice on a fall-back day. cronsim's own tz-aware mode follows the same rule as ours but
drops a slot at Lord Howe's half-hour fall-back, hence the rule lives here. The rule, from
Debian cron:

* a fixed wall-clock time in a spring-forward gap fires once, at the first valid instant
  after the gap;
* a fixed wall-clock time that repeats at fall-back fires once, at its first occurrence;
* expressions whose minute or hour field starts with `*` (`*/15 * * * *`, `0 */2 * * *`)
  follow elapsed time through both transitions, so they neither stall nor double.

Missed slots (the pump was down) follow the registration's misfire policy, see `advance`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ScheduleError

__all__ = [
    "MAX_CRON_CHARS",
    "Anchor",
    "Cadence",
    "CheckedCadence",
    "Cron",
    "Every",
    "Misfire",
    "advance",
    "cadence_from_fields",
    "next_runs",
    "parse_every",
    "parse_every_ms",
]

Anchor = Literal["schedule", "release"]
Misfire = Literal["coalesce", "catchup"]
ANCHORS: tuple[Anchor, ...] = ("schedule", "release")
MISFIRES: tuple[Misfire, ...] = ("coalesce", "catchup")

# Counting missed cron slots after a very long outage is capped; past the cap the
# count is a lower bound and the cadence jumps straight to the next future slot.
MAX_COUNTED_MISSES = 10_000

# Every field of a 5-field expression written out value by value is ~360 characters; a
# longer one is not a schedule, and its next runs would cost seconds in every claim.
MAX_CRON_CHARS = 512

CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_EVERY_RE = re.compile(r"(\d+)\s*(ms|s|m|h|d|w)", re.ASCII)
# A bare number of seconds, as `every` takes it: "90", "1.5" (at most 20 digits each side).
_SECONDS_RE = re.compile(r"\d{1,20}(\.\d{1,20})?", re.ASCII)
# Scores are epoch ms held in a double, exact up to 2**53: an interval stays far below that.
MAX_EVERY_MS = 1000 * 365 * 86_400_000


class Cadence(Protocol):
    """When the next run is. Every implementation is a frozen value with no I/O.

    A cadence that cannot name its next run, only say at a check whether it is due (a
    Celery schedule whose `is_due` decides), also has `check`: see `CheckedCadence`.
    """

    @property
    def kind(self) -> str: ...

    def first_run(self, now_ms: int) -> int:
        """Return the first run of a fresh registration created at `now_ms`."""
        ...

    def next_after(self, after_ms: int) -> int:
        """Return the first slot strictly after `after_ms`."""
        ...

    def to_fields(self) -> dict[str, str]:
        """Return the record fields that store this cadence."""
        ...

    def describe(self) -> str:
        """Return the cadence in words, for people."""
        ...


class CheckedCadence(Cadence, Protocol):
    """A cadence decided at each check, as Celery's beat decides with `is_due`.

    Its registry score is the next *check*, not a run: `first_run` is the first check and
    `next_after` the check after one. The pump, seeing `check`, calls it instead of
    `advance` and fires only when it says due; either way the claim moves the score to the
    next check it names (compare-and-set, as for a run). No slot is ever counted missed.
    Its code may do I/O (it lives in the process that holds the schedule object).
    """

    def check(self, last_run_ms: int, now_ms: int) -> tuple[bool, int]:
        """Return (due now, the next check in epoch ms, after `now_ms`).

        `last_run_ms` is when the registration last fired (its record's `last_fired_ms`,
        or its `last_due_ms` if later), or when it was created if it never fired.
        """
        ...


def parse_every(value: float | timedelta | str) -> int:
    """Return an interval in ms from seconds, a `timedelta`, or a string like `"15m"`.

    A bare number means seconds, as in Celery (`"schedule": 90`), APScheduler and periodiq:
    `90`, `1.5` and `"90"` are 90 s, 1.5 s and 90 s. `every_ms` takes milliseconds.
    """
    if isinstance(value, bool):
        raise ScheduleError(
            f"every must be seconds, a timedelta or a string like '15m', not {value!r}"
        )
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ScheduleError(f"every must be a finite number of seconds, got {value!r}")
        seconds = value
    elif isinstance(value, str) and _SECONDS_RE.fullmatch(value.strip()):
        seconds = float(value.strip())
    else:
        return parse_every_ms(value)
    if seconds > MAX_EVERY_MS / 1000:
        raise ScheduleError(f"every must be at most 1000 years, got {value!r} seconds")
    every_ms = round(seconds * 1000)
    if every_ms <= 0:
        raise ScheduleError(f"every must be at least 1 ms, got {value!r} seconds")
    return every_ms


def parse_every_ms(value: int | timedelta | str) -> int:
    """Return an interval in ms from ms, a `timedelta`, or a string like `"15m"` / `"1h30m"`.

    A bare number here means milliseconds (EchoMQ's `every_ms`); see `parse_every` for `every`.
    """
    if isinstance(value, bool):
        raise ScheduleError(f"every must be ms, a timedelta or a string like '15m', not {value!r}")
    if isinstance(value, timedelta):
        every_ms = int(value.total_seconds() * 1000)
    elif isinstance(value, int):
        every_ms = value
    elif isinstance(value, str):
        text = value.strip().lower()
        if text.isascii() and text.isdigit() and len(text) <= 20:
            every_ms = int(text)
        else:
            parts = _EVERY_RE.findall(text)
            if not parts or _EVERY_RE.sub("", text).strip() or any(len(n) > 20 for n, _ in parts):
                raise ScheduleError(
                    f"every {value!r} is not an interval; use ms or a string like "
                    "'500ms', '30s', '15m', '1h30m', '2d'"
                )
            every_ms = sum(int(n) * _UNITS_MS[unit] for n, unit in parts)
    else:
        raise ScheduleError(f"every must be ms, a timedelta or a string like '15m', not {value!r}")
    if every_ms <= 0:
        raise ScheduleError(f"every must be a positive interval, got {value!r}")
    if every_ms > MAX_EVERY_MS:
        raise ScheduleError(f"every must be at most 1000 years ({MAX_EVERY_MS} ms), got {value!r}")
    return every_ms


def _words_ms(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True, slots=True)
class Every:
    """A fixed interval, start-to-start."""

    every_ms: int
    anchor: Anchor = "schedule"

    def __post_init__(self) -> None:
        if isinstance(self.every_ms, bool) or not isinstance(self.every_ms, int):
            raise ScheduleError(f"every_ms must be an int, got {self.every_ms!r}")
        if self.every_ms <= 0:
            raise ScheduleError(f"every_ms must be positive, got {self.every_ms}")
        if self.every_ms > MAX_EVERY_MS:
            raise ScheduleError(
                f"every_ms must be at most {MAX_EVERY_MS} (1000 years), got {self.every_ms}"
            )
        if self.anchor not in ANCHORS:
            raise ScheduleError(f"anchor must be one of {ANCHORS}, got {self.anchor!r}")

    @property
    def kind(self) -> str:
        return "every"

    def first_run(self, now_ms: int) -> int:
        return now_ms + self.every_ms

    def next_after(self, after_ms: int) -> int:
        return after_ms + self.every_ms

    def to_fields(self) -> dict[str, str]:
        return {"every_ms": str(self.every_ms), "anchor": self.anchor}

    def describe(self) -> str:
        return f"every {_words_ms(self.every_ms)}" + (
            " (from release)" if self.anchor == "release" else ""
        )


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (
        ZoneInfoNotFoundError,
        ValueError,
        TypeError,
        OSError,
    ) as exc:  # OSError: 'Europe' is a directory
        raise ScheduleError(
            f"unknown time zone {tz!r}; use an IANA name such as 'Europe/Paris'"
        ) from exc


@dataclass(frozen=True, slots=True)
class Cron:
    """A 5-field cron expression in an IANA time zone (default UTC).

    `day_and=True` makes a restricted day-of-month and day-of-week both have to match, as
    Celery's `crontab` does; the default follows cron, where either may match.
    """

    expr: str
    tz: str = "UTC"
    day_and: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.expr, str):
            raise ScheduleError(f"cron must be a string, got {type(self.expr).__name__}")
        if len(self.expr) > MAX_CRON_CHARS:
            # Not quoted: the message stays one short line, whatever was given.
            raise ScheduleError(
                f"cron expression is {len(self.expr)} characters; the limit is {MAX_CRON_CHARS}"
            )
        expanded = CRON_ALIASES.get(self.expr.strip().lower(), self.expr)
        if len(expanded.split()) != 5:
            raise ScheduleError(
                f"cron {self.expr!r} must have 5 fields (minute hour day month weekday) "
                f"or be one of {sorted(CRON_ALIASES)}"
            )
        _zone(self.tz)
        try:
            CronSim(expanded, datetime(2000, 1, 1))
        except (CronSimError, ValueError, KeyError, IndexError) as exc:
            raise ScheduleError(f"invalid cron {self.expr!r}: {exc}") from exc
        # Refuse expressions that never fire (e.g. "0 0 31 2 *"): the registry would hold a
        # member with no next run.
        try:
            self.next_after(946_684_800_000)
        except StopIteration as exc:
            raise ScheduleError(f"cron {self.expr!r} never fires") from exc

    @property
    def kind(self) -> str:
        return "cron"

    @property
    def expanded(self) -> str:
        return CRON_ALIASES.get(self.expr.strip().lower(), self.expr)

    @property
    def follows_elapsed_time(self) -> bool:
        """True when the minute or hour field starts with `*` (Debian cron's wildcard jobs)."""
        minute, hour = self.expanded.split()[:2]
        return minute.startswith("*") or hour.startswith("*")

    def _walls(self, start: datetime) -> Iterator[datetime]:
        sim = CronSim(self.expanded, start)
        if self.day_and:
            # cronsim ORs two restricted day fields as cron does; Celery ANDs them.
            sim.day_and = True
        return sim

    def _instants(self, wall: datetime, zone: ZoneInfo) -> list[datetime]:
        """Map a matching wall time to the instants it fires at, by the DST rule."""
        first = wall.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
        if first.astimezone(zone).replace(tzinfo=None) == wall:
            second = wall.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
            if second != first and self.follows_elapsed_time:
                return [first, second]  # a repeated wall time, on elapsed time: both
            return [first]  # a fixed time that repeats fires at its first occurrence
        if self.follows_elapsed_time:
            return []  # in a gap, elapsed-time jobs run on the new time
        # A fixed time in a gap fires at the first valid instant after it: the transition.
        before = wall.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
        low, high = before, first
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) / 2
            if middle.astimezone(zone).replace(tzinfo=None) < wall:
                low = middle
            else:
                high = middle
        return [high.replace(microsecond=0)]

    def next_after(self, after_ms: int) -> int:
        # cronsim matches calendar fields on naive wall times; the DST rule is ours
        # (`_instants`). cronsim's own tz-aware mode drops a slot at Lord Howe's half-hour
        # fall-back, which tests/test_cadence.py's oracle caught.
        zone = ZoneInfo(self.tz)
        after = datetime.fromtimestamp(after_ms / 1000, tz=timezone.utc)
        # Near a transition, start 3 hours of wall time early: in a repeated hour, a wall
        # time "before" the local time of `after` can still fire after it.
        start = after.astimezone(zone).replace(tzinfo=None)
        if not _no_transition_near(zone, after, after):
            start -= _DST_SPAN
        walls = self._walls(start)
        best: datetime | None = None
        for wall in walls:
            if best is not None and wall > best.astimezone(zone).replace(tzinfo=None) + _DST_SPAN:
                break
            for instant in self._instants(wall, zone):
                if instant > after and (best is None or instant < best):
                    best = instant
            if best is not None and _no_transition_near(zone, after, best):
                break  # wall order is instant order away from transitions
        if best is None:  # pragma: no cover - cronsim stops only after 50 years
            raise StopIteration
        return int(best.timestamp() * 1000)

    def first_run(self, now_ms: int) -> int:
        return self.next_after(now_ms)

    def to_fields(self) -> dict[str, str]:
        fields = {"cron": self.expr, "tz": self.tz}
        if self.day_and:
            fields["day_and"] = "1"
        return fields

    def describe(self) -> str:
        return f"cron {self.expr} ({self.tz})"


_DST_SPAN = timedelta(hours=3)  # larger than any DST shift (Troll's is 2 h)


def _no_transition_near(zone: ZoneInfo, start: datetime, end: datetime) -> bool:
    """True when `zone` keeps one offset from `start - 3h` to `end + 3h` and they are close."""
    if end - start > timedelta(hours=12):
        return False
    return (start - _DST_SPAN).astimezone(zone).utcoffset() == (end + _DST_SPAN).astimezone(
        zone
    ).utcoffset()


def cadence_from_fields(fields: dict[str, str]) -> Cadence:
    """Rebuild a cadence from record fields; raise `ScheduleError` if they are inconsistent."""
    if fields.get("cron"):
        return Cron(fields["cron"], fields.get("tz") or "UTC", fields.get("day_and") == "1")
    raw = fields.get("every_ms")
    if not raw:
        raise ScheduleError("record has neither every_ms nor cron")
    try:
        every_ms = int(raw)
    except ValueError as exc:
        raise ScheduleError(f"every_ms {raw!r} is not an integer") from exc
    anchor = fields.get("anchor") or "schedule"
    if anchor not in ANCHORS:
        raise ScheduleError(f"anchor {anchor!r} is not one of {ANCHORS}")
    return Every(every_ms, anchor)


def advance(
    cadence: Cadence, due_ms: int, now_ms: int, misfire: Misfire = "coalesce"
) -> tuple[int, int]:
    """Return `(next_ms, missed)` for an occurrence due at `due_ms` released at `now_ms`.

    * `coalesce` (default): the occurrence at `due_ms` fires; every later slot that is
      already past is dropped and counted in `missed`; the next run is the first future slot.
    * `catchup`: nothing is dropped; the next run is the slot after `due_ms`, even if it
      is past, so the pump fires the missed slots one by one.

    An `Every` with `anchor="release"` always resumes at `now + every`; the slots it skips
    are counted as missed.
    """
    if isinstance(cadence, Every):
        every = cadence.every_ms
        late = max(0, now_ms - due_ms)
        if cadence.anchor == "release":
            return now_ms + every, late // every
        if misfire == "catchup":
            return due_ms + every, 0
        missed = late // every
        return due_ms + (missed + 1) * every, missed
    next_ms = cadence.next_after(due_ms)
    if misfire == "catchup":
        return next_ms, 0
    missed = 0
    while next_ms <= now_ms:
        missed += 1
        if missed >= MAX_COUNTED_MISSES:
            return cadence.next_after(now_ms), missed
        next_ms = cadence.next_after(next_ms)
    return next_ms, missed


def next_runs(cadence: Cadence, after_ms: int, n: int) -> list[int]:
    """Return the next `n` slots strictly after `after_ms`."""
    runs: list[int] = []
    at = after_ms
    for _ in range(n):
        at = cadence.next_after(at)
        runs.append(at)
    return runs
