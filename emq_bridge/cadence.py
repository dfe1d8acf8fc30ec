"""Cadences: pure next-run math in epoch milliseconds. No I/O, no clock.

Two kinds reduce to one epoch-ms score:

* `Every`: an interval. `anchor="grid"` (the default) fires on the epoch grid shifted by
  `offset_ms`: the instants `offset + k * every` (k whole), whenever it was registered, so a
  15-minute job fires at :00/:15/:30/:45 UTC. `anchor="release"` gives `next = now + every`,
  EchoMQ's `advance/4` literally. `anchor="schedule"` is the phase of the registration
  instant (`next = due + every`), what records written before the grid existed hold.
* `At`: one-off instants (a one-off date trigger); after the last one there is no next run.
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
* an expression whose minute or hour field starts with `*` (`*/15 * * * *`, `0 */2 * * *`)
  fires each matching wall time at every instant it exists: not at all for wall times a
  spring-forward gap skips, twice (an hour apart) for wall times repeated at fall-back.
  For an expression that matches every hour (`*/15 * * * *`, `0 * * * *`) that is elapsed
  time: no stall, no double. For one that does not, it stalls and doubles by design:
  Paris `0 */2 * * *` runs 00:00 then 04:00 (3 h) at spring-forward, and 02:00 CEST then
  02:00 CET (1 h apart) at fall-back.

Missed slots (the pump was down) follow the registration's misfire policy, see `catch_up`.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ScheduleError
from .hashed import resolve_hashed, uses_hash
from .millis import floor_ms, iso_utc, utc_datetime
from .shown import shown

__all__ = [
    "LATEST_MS",
    "MAX_CRON_CHARS",
    "NEVER_MS",
    "Anchor",
    "At",
    "Cadence",
    "CatchUp",
    "CheckedCadence",
    "Cron",
    "Every",
    "Misfire",
    "advance",
    "cadence_from_fields",
    "catch_up",
    "check_cron_steps",
    "misfire_policy",
    "next_runs",
    "parse_every",
    "parse_every_ms",
    "parse_span",
]

Anchor = Literal["grid", "schedule", "release"]
# Misfire policies (see `catch_up`). `coalesce` and `catchup` are version 1's names of
# `latest` and `all`, kept: records and files that use them load, keep their digest, and
# behave as `latest` / `all`.
Misfire = Literal["latest", "earliest", "skip", "all", "coalesce", "catchup"]
ANCHORS: tuple[Anchor, ...] = ("grid", "schedule", "release")
MISFIRES: tuple[Misfire, ...] = ("latest", "earliest", "skip", "all", "coalesce", "catchup")
MISFIRE_ALIASES: dict[str, str] = {"coalesce": "latest", "catchup": "all"}
# `skip`'s catch-up window when none is given: a slot released later than this is missed,
# one released sooner is on time (Quartz's default misfire threshold).
SKIP_GRACE_MS = 60_000
# `all` fires at most this many missed slots per catch-up unless `catchup_max` is given
# (version 1's `catchup` had no bound: a 1 s schedule after a day's outage sent 86,400).
DEFAULT_CATCHUP_MAX = 100
MAX_CATCHUP_MAX = 10_000

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
# A number and its unit, "15m", "1.5h": the parts of an interval string ("1h30m").
_EVERY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.ASCII)
# A bare number of seconds, as `every` takes it: "90", "1.5" (at most 20 digits each side).
_SECONDS_RE = re.compile(r"\d{1,20}(\.\d{1,20})?", re.ASCII)
# Scores are epoch ms held in a double, exact up to 2**53: an interval stays far below that.
MAX_EVERY_MS = 1000 * 365 * 86_400_000
# What `At.next_after` returns past its last instant: no slot. Never written as a score: the
# moves complete a registration whose next score is past its last instant (bounds.py).
NEVER_MS = 2**53 - 1
# The last instant a `datetime` can hold, 9999-12-31T23:59:59.999Z: a given instant must be
# at or before it, and a slot after it is no slot (`NEVER_MS`), so every run can be shown.
LATEST_MS = 253_402_300_799_999
# One-off instants per registration (`At`): the record holds them all.
MAX_AT = 1000


def now_arg(value: int | None) -> int | None:
    """Return `value`, a caller's `now_ms` (None: the server's clock), once it is an int of
    epoch ms from 1970 to the end of 9999; else `ScheduleError` (a float or a str would reach
    the scripts as a score or a lease member no move reads back)."""
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= LATEST_MS:
        raise ScheduleError(
            f"now_ms must be an int of epoch ms from 0 (1970) to {LATEST_MS} (9999), "
            f"got {shown(value)}"
        )
    return value


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
            f"every must be seconds, a timedelta or a string like '15m', not {shown(value)}"
        )
    if isinstance(value, int) and abs(value) > MAX_EVERY_MS:  # past what a float holds, too
        bound = "at most 1000 years" if value > 0 else "at least 1 ms"
        raise ScheduleError(f"every must be {bound}, got {shown(value)} seconds")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ScheduleError(f"every must be a finite number of seconds, got {shown(value)}")
        seconds = value
    elif isinstance(value, str) and _SECONDS_RE.fullmatch(value.strip()):
        seconds = float(value.strip())
    elif isinstance(value, timedelta | str):
        return parse_every_ms(value)
    else:  # said here: `parse_every_ms`'s message names its own unit, ms
        raise ScheduleError(
            f"every must be seconds, a timedelta or a string like '15m', not {shown(value)}"
        )
    if seconds > MAX_EVERY_MS / 1000:
        raise ScheduleError(f"every must be at most 1000 years, got {shown(value)} seconds")
    if seconds < 0:  # before `round`: a float past -1.8e305 s overflows there
        raise ScheduleError(f"every must be at least 1 ms, got {shown(value)} seconds")
    every_ms = round(seconds * 1000)
    if every_ms <= 0:
        raise ScheduleError(f"every must be at least 1 ms, got {shown(value)} seconds")
    return every_ms


# The longest interval string read ("1w 6d 23h 59m 59s 999ms" is 25): a longer one is refused
# before any pattern reads it (the patterns take time quadratic in a run of digits).
MAX_INTERVAL_CHARS = 256


def _check_interval_text(text: str, value: object, what: str) -> None:
    if len(text) > MAX_INTERVAL_CHARS:
        raise ScheduleError(
            f"{what} {shown(value)} is not an interval: more than {MAX_INTERVAL_CHARS} characters"
        )


# Zero as `parse_every` would read it: "0", "0.0", "0s", "0ms", "0h0m", any case.
_ZERO_RE = re.compile(r"0+(\.0*)?|(0+\s*(ms|s|m|h|d|w)\s*)+", re.ASCII)


def parse_span(value: float | timedelta | str | None, what: str) -> int:
    """Return a duration in ms as `parse_every` reads it, where zero (in any form) or None
    means none: an offset or a jitter. Errors name `what` instead of `every`."""
    if value is None or (isinstance(value, timedelta) and not value):
        return 0
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0
    if isinstance(value, str):
        _check_interval_text(value, value, what)
        if _ZERO_RE.fullmatch(value.strip().lower()):
            return 0
    try:
        return parse_every(value)
    except ScheduleError as exc:
        raise ScheduleError(str(exc).replace("every", what, 1)) from None


def parse_every_ms(value: int | timedelta | str) -> int:
    """Return an interval in ms from ms, a `timedelta`, or a string like `"15m"` / `"1h30m"`.

    A bare number here means milliseconds (EchoMQ's `every_ms`); see `parse_every` for `every`.
    """
    if isinstance(value, bool):
        raise ScheduleError(
            f"every_ms must be ms, a timedelta or a string like '15m', not {shown(value)}"
        )
    if isinstance(value, timedelta):
        every_ms = floor_ms(value)
    elif isinstance(value, int):
        every_ms = value
    elif isinstance(value, str):
        _check_interval_text(value, value, "every")
        text = value.strip().lower()
        if text.isascii() and text.isdigit() and len(text) <= 20:
            every_ms = int(text)
        else:
            parts = _EVERY_RE.findall(text)
            if not parts or _EVERY_RE.sub("", text).strip() or any(len(n) > 41 for n, _ in parts):
                raise ScheduleError(
                    f"every {shown(value)} is not an interval; use ms or a string like "
                    "'500ms', '30s', '1.5h', '1h30m', '2d'"
                )
            sizes = [_UNITS_MS[unit] for _, unit in parts]
            if any(later >= earlier for earlier, later in itertools.pairwise(sizes)):
                # "1m1m", "1s1m": a typo more likely than a sum (each unit once, largest first)
                raise ScheduleError(
                    f"every {shown(value)} is not an interval: give each unit once, the "
                    "largest first ('1h30m', not '30m1h' or '1m1m')"
                )
            # Decimal, not float: "0.1s" + "0.2s" is exactly 300 ms, and a part finer than
            # a millisecond is refused rather than rounded away.
            exact = sum((Decimal(n) * _UNITS_MS[unit] for n, unit in parts), Decimal(0))
            if exact != exact.to_integral_value():
                raise ScheduleError(f"every {shown(value)} is not a whole number of ms")
            every_ms = int(exact)
    else:
        raise ScheduleError(
            f"every_ms must be ms, a timedelta or a string like '15m', not {shown(value)}"
        )
    if every_ms <= 0:
        raise ScheduleError(f"every must be a positive interval, got {shown(value)}")
    if every_ms > MAX_EVERY_MS:
        raise ScheduleError(
            f"every must be at most 1000 years ({MAX_EVERY_MS} ms), got {shown(value)}"
        )
    return every_ms


def _words_ms(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True, slots=True)
class Every:
    """A fixed interval, start-to-start.

    `anchor="grid"`: the slots are `offset_ms + k * every_ms` from the Unix epoch (UTC), so
    they do not depend on when the schedule was registered or changed. An interval that
    divides a day (1m, 15m, 1h, 6h, 1d) lands on the same UTC times every day; one that does
    not (7m, 5h, 7d) follows the epoch grid, so its times of day shift from day to day (7d
    fires on Thursdays 00:00 UTC, the epoch's weekday, plus `offset_ms`).
    """

    every_ms: int
    anchor: Anchor = "grid"
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.every_ms, bool) or not isinstance(self.every_ms, int):
            raise ScheduleError(f"every_ms must be an int, got {shown(self.every_ms)}")
        if self.every_ms <= 0:
            raise ScheduleError(f"every_ms must be positive, got {self.every_ms}")
        if self.every_ms > MAX_EVERY_MS:
            raise ScheduleError(
                f"every_ms must be at most {MAX_EVERY_MS} (1000 years), got {self.every_ms}"
            )
        if self.anchor not in ANCHORS:
            raise ScheduleError(f"anchor must be one of {ANCHORS}, got {shown(self.anchor)}")
        if isinstance(self.offset_ms, bool) or not isinstance(self.offset_ms, int):
            raise ScheduleError(f"offset must be a whole number of ms, got {shown(self.offset_ms)}")
        if self.offset_ms and self.anchor != "grid":
            raise ScheduleError(f"offset needs anchor='grid'; anchor={self.anchor!r} has no grid")
        if not 0 <= self.offset_ms < self.every_ms:
            raise ScheduleError(
                f"offset must be from 0 to less than the interval ({self.every_ms} ms), "
                f"got {self.offset_ms} ms"
            )

    @property
    def kind(self) -> str:
        return "every"

    def first_run(self, now_ms: int) -> int:
        if self.anchor == "grid":
            return self.next_after(now_ms)
        return now_ms + self.every_ms

    def next_after(self, after_ms: int) -> int:
        if self.anchor == "grid":
            slot = after_ms - (after_ms - self.offset_ms) % self.every_ms + self.every_ms
        else:
            slot = after_ms + self.every_ms
        return slot if slot <= LATEST_MS else NEVER_MS

    def to_fields(self) -> dict[str, str]:
        fields = {"every_ms": str(self.every_ms), "anchor": self.anchor}
        if self.offset_ms:
            fields["offset_ms"] = str(self.offset_ms)
        return fields

    def describe(self) -> str:
        words = f"every {_words_ms(self.every_ms)}"
        if self.offset_ms:
            words += f" offset {_words_ms(self.offset_ms)}"
        if self.anchor == "release":
            words += " (from release)"
        elif self.anchor == "schedule":
            words += " (from registration)"
        return words


@dataclass(frozen=True, slots=True)
class At:
    """One-off instants, epoch ms, sorted and distinct: a date trigger. No slot after the last."""

    instants_ms: tuple[int, ...]

    def __post_init__(self) -> None:
        instants = self.instants_ms
        if not isinstance(instants, tuple) or not instants:
            raise ScheduleError("at needs at least one instant")
        if len(instants) > MAX_AT:
            raise ScheduleError(f"at takes at most {MAX_AT} instants, got {len(instants)}")
        for value in instants:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LATEST_MS:
                raise ScheduleError(
                    f"an at instant must be epoch ms from 0 (1970) to {LATEST_MS} (9999), "
                    f"got {shown(value)}"
                )
        if any(a >= b for a, b in itertools.pairwise(instants)):
            raise ScheduleError("at instants must be sorted and distinct")

    @property
    def kind(self) -> str:
        return "at"

    @property
    def last_ms(self) -> int:
        return self.instants_ms[-1]

    def first_run(self, now_ms: int) -> int:
        # An instant equal to now has not passed: it fires (it was created completed).
        index = bisect.bisect_left(self.instants_ms, now_ms)
        return self.instants_ms[index] if index < len(self.instants_ms) else NEVER_MS

    def next_after(self, after_ms: int) -> int:
        index = bisect.bisect_right(self.instants_ms, after_ms)
        return self.instants_ms[index] if index < len(self.instants_ms) else NEVER_MS

    def to_fields(self) -> dict[str, str]:
        return {"at": ",".join(map(str, self.instants_ms))}

    def describe(self) -> str:
        first = iso_utc(self.instants_ms[0])
        if len(self.instants_ms) == 1:
            return f"at {first}"
        return f"at {first} and {len(self.instants_ms) - 1} more"


# Names the zone database holds that are no IANA zone: `localtime` is each host's own
# /etc/localtime, `posixrules` and `Factory` are build artefacts, `posix/` and `right/` are
# variants (`right/` counts leap seconds) a host may lack. A schedule in one of them would
# fire at different instants on different pumps. Compared case-folded: a case-insensitive
# file system (macOS) finds `LocalTime` too.
_HOST_ZONES = frozenset({"localtime", "posixrules", "factory"})
_HOST_ZONE_DIRS = ("posix/", "right/")


def _zone(tz: str, stored: bool = False) -> ZoneInfo:
    if not isinstance(tz, str):
        hint = f" (its key: {tz.key!r})" if isinstance(tz, ZoneInfo) and tz.key else ""
        raise ScheduleError(
            f"tz must be an IANA name such as 'Europe/Paris', got {type(tz).__name__}{hint}"
        )
    folded = tz.casefold()
    if not stored and (folded in _HOST_ZONES or folded.startswith(_HOST_ZONE_DIRS)):
        raise ScheduleError(
            f"time zone {shown(tz)} is a file of the host's zone database, not an IANA zone: "
            "it may differ from host to host; use an IANA name such as 'Europe/Paris' or 'UTC'"
        )
    try:
        return ZoneInfo(tz)
    except (
        ZoneInfoNotFoundError,
        ValueError,
        TypeError,
        OSError,
    ) as exc:  # OSError: 'Europe' is a directory
        raise ScheduleError(
            f"unknown time zone {shown(tz)}; use an IANA name such as 'Europe/Paris'"
        ) from exc


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression in an IANA time zone (default UTC).

    5 fields (minute hour day month weekday), or 6 with seconds first (APScheduler's and
    Quartz's sub-minute crons), or an `@alias`. cronsim's `L` (day of month `L`, `LW`;
    weekday `5L`), `#` (`1#2`, the second Monday) and Jenkins' `H` (`emq_bridge.hashed`,
    one value per `seed`, the registration name) are accepted.
    `day_and=True` makes a restricted day-of-month and day-of-week both have to match, as
    Celery's `crontab` does; the default follows cron, where either may match.
    """

    expr: str
    tz: str = "UTC"
    day_and: bool = False
    seed: str | None = None
    # Read back from a record (`cadence_from_fields`): what a release before session 27 took
    # (a cron holding a tab-like blank, a host zone file such as 'localtime') keeps firing
    # rather than reading as corrupt; new definitions are refused it.
    stored: bool = field(default=False, repr=False, compare=False)
    # The expression handed to cronsim: the alias expanded, `H` resolved (set once).
    resolved: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expr, str):
            raise ScheduleError(f"cron must be a string, got {type(self.expr).__name__}")
        if len(self.expr) > MAX_CRON_CHARS:
            # Not quoted: the message stays one short line, whatever was given.
            raise ScheduleError(
                f"cron expression is {len(self.expr)} characters; the limit is {MAX_CRON_CHARS}"
            )
        if not self.stored:
            _check_cron_text(self.expr)
        if self.seed is not None and not isinstance(self.seed, str):
            raise ScheduleError(f"cron seed must be a string, got {type(self.seed).__name__}")
        if not isinstance(self.day_and, bool):  # "no" would switch it on
            raise ScheduleError(f"day_and must be True or False, got {shown(self.day_and)}")
        key = (self.expr, self.tz, self.day_and, self.seed, self.stored)
        if isinstance(self.tz, str) and isinstance(self.day_and, int):  # hashable: cached
            resolved = _checked_cron(*key)
        else:
            resolved = _check_cron(*key)
        object.__setattr__(self, "resolved", resolved)

    @property
    def kind(self) -> str:
        return "cron"

    @property
    def expanded(self) -> str:
        return CRON_ALIASES.get(self.expr.strip().lower(), self.expr)

    @property
    def follows_elapsed_time(self) -> bool:
        """True when the minute or hour field starts with `*` (Debian cron's wildcard jobs).

        A 6-field expression follows the same rule on its minute and hour fields.
        """
        return _follows_elapsed_time(self.resolved)

    def _walls(self, start: datetime) -> Iterator[datetime]:
        return _cron_walls(self.resolved, self.day_and, start)

    def _instants(self, wall: datetime, zone: ZoneInfo) -> list[datetime]:
        """Map a matching wall time to the instants it fires at, by the DST rule."""
        return _cron_instants(wall, zone, self.follows_elapsed_time)

    def next_after(self, after_ms: int) -> int:
        return _cron_next(self.resolved, self.tz, bool(self.day_and), after_ms)

    def first_run(self, now_ms: int) -> int:
        return self.next_after(now_ms)

    def to_fields(self) -> dict[str, str]:
        fields = {"cron": self.expr, "tz": self.tz}
        if self.day_and:
            fields["day_and"] = "1"
        if self.seed is not None and uses_hash(self.expr):
            fields["seed"] = self.seed  # only an expression with H depends on it
        return fields

    def describe(self) -> str:
        # `day_and` changes which days fire only when both day fields are restricted.
        where = f"{self.tz}; day of month and of week both" if self._days_anded() else self.tz
        if uses_hash(self.expr):  # what its H stands for, for this name
            return f"cron {self.expr} = {self.resolved} ({where})"
        return f"cron {self.expr} ({where})"

    def _days_anded(self) -> bool:
        if not self.day_and:
            return False
        fields = self.resolved.split()
        days = (fields[2], fields[4]) if len(fields) == 5 else (fields[3], fields[5])
        return all(day not in ("*", "?") for day in days)


_DST_SPAN = timedelta(hours=3)  # larger than any DST shift (Troll's is 2 h)
# Each field's name and how many values it has, minute first (5 fields) or second first (6):
# the largest step a field takes, as `H/n` (hashed.py) is checked.
_STEP_FIELDS_5 = (
    ("minute", 60),
    ("hour", 24),
    ("day of month", 31),
    ("month", 12),
    ("day of week", 7),
)
_STEP_FIELDS_6 = (("second", 60), *_STEP_FIELDS_5)


def _check_cron_text(expr: str) -> None:
    """Raise `ScheduleError` unless `expr` is printable ASCII, its fields separated by spaces
    or tabs (as crontab(5) separates them, so records written with tabs keep firing):
    `str.split` also splits on line breaks and Unicode spaces, which the record would keep
    and the CLI print (a carriage return rewrites the terminal's line)."""
    if expr.isascii() and expr.isprintable():  # the common case, in one pass
        return
    odd = next((c for c in expr if c != "\t" and not (c.isascii() and c.isprintable())), None)
    if odd is None:
        return
    raise ScheduleError(
        f"cron {shown(expr)} holds the character {odd!r} (U+{ord(odd):04X}): write it in "
        "printable ASCII, its fields separated by spaces or tabs"
    )


def check_cron_steps(fields: list[str]) -> None:
    """Raise `ScheduleError` if a step (`*/n`, `a-b/n`, `a/n`) is larger than its field has
    values: cronsim reads `*/61` in the minutes as `0` and takes steps of any length, where
    `H/61` is refused. A step that is not a number is left to cronsim to refuse."""
    named = _STEP_FIELDS_6 if len(fields) == 6 else _STEP_FIELDS_5
    for (what, count), text in zip(named, fields, strict=True):
        for term in text.split(","):
            step = term.partition("/")[2]
            if not (step.isascii() and step.isdigit()):
                continue
            digits = step.lstrip("0")  # read as an int only when short: it may be 500 digits
            if len(digits) > 4 or not 1 <= int(digits or "0") <= count:
                raise ScheduleError(f"{what} field {shown(term)}: the step must be 1 to {count}")


# The most days each month can have (February's leap day included).
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_NUMBERS = re.compile(r"\d{1,2}(,\d{1,2})*", re.ASCII)


def _day_in_no_month(fields: list[str]) -> str | None:
    """Why a cron of plain day-of-month and month lists never fires (`0 0 30 2 *`: no
    February has a 30th), or None: cronsim refuses it as a "Bad day-of-month" only."""
    day, month = fields[-3], fields[-2]
    if not (_NUMBERS.fullmatch(day) and _NUMBERS.fullmatch(month)):
        return None
    days, months = [int(d) for d in day.split(",")], [int(m) for m in month.split(",")]
    if not all(1 <= d <= 31 for d in days) or not all(1 <= m <= 12 for m in months):
        return None
    if min(days) <= max(_MONTH_DAYS[m - 1] for m in months):
        return None
    return f"no month {month} has a day {day}"


def _check_cron(expr: str, tz: str, day_and: bool, seed: str | None, stored: bool = False) -> str:
    """Return the expression handed to cronsim (alias expanded, `H` resolved); raise
    `ScheduleError` if it is not a cron that fires in a known zone."""
    fields = CRON_ALIASES.get(expr.strip().lower(), expr).split()
    if len(fields) not in (5, 6):
        raise ScheduleError(
            f"cron {shown(expr)} must have 5 fields (minute hour day month weekday), "
            f"6 with seconds first, or be one of {sorted(CRON_ALIASES)}"
        )
    try:
        resolved_fields = resolve_hashed(fields, seed or "")
        check_cron_steps(resolved_fields)
        resolved = " ".join(resolved_fields)
    except ScheduleError as exc:
        raise ScheduleError(f"invalid cron {shown(expr)}: {exc}") from None
    _zone(tz, stored)
    try:
        CronSim(resolved, datetime(2000, 1, 1))
    except (CronSimError, ValueError, KeyError, IndexError) as exc:
        why = str(exc) == "Bad day-of-month" and _day_in_no_month(resolved_fields)
        if why:  # cronsim says only "Bad day-of-month"
            raise ScheduleError(f"cron {shown(expr)} never fires: {why}") from exc
        raise ScheduleError(f"invalid cron {shown(expr)}: {exc}") from exc
    # Refuse expressions that never fire (e.g. "0 0 31 2 *"): the registry would hold a
    # member with no next run.
    try:
        _cron_next(resolved, tz, bool(day_and), 946_684_800_000)
    except StopIteration as exc:
        raise ScheduleError(f"cron {shown(expr)} never fires") from exc
    return resolved


# A schedule declares the same few crons many times over (a `beat_schedule` of 100,000
# entries may hold a dozen distinct crontabs), and many registrations of one cron ask for
# the same next run (a sync's one `now`, a pump's one slot): both are pure, so cached.
# Errors are not cached: a bad cron is checked again, and fails the same way.
_checked_cron = functools.lru_cache(maxsize=4096)(_check_cron)


def _follows_elapsed_time(resolved: str) -> bool:
    minute, hour = resolved.split()[-5:-3]
    return minute.startswith("*") or hour.startswith("*")


def _cron_walls(resolved: str, day_and: bool, start: datetime) -> Iterator[datetime]:
    sim = CronSim(resolved, start)
    if day_and:
        # cronsim ORs two restricted day fields as cron does; Celery ANDs them.
        sim.day_and = True
    return sim


def _cron_instants(wall: datetime, zone: ZoneInfo, elapsed: bool) -> list[datetime]:
    """Map a matching wall time to the instants it fires at, by the DST rule (`elapsed`:
    the expression follows elapsed time, see `Cron.follows_elapsed_time`)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        second = wall.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
        if second != first and elapsed:
            return [first, second]  # a repeated wall time, on elapsed time: both
        return [first]  # a fixed time that repeats fires at its first occurrence
    if elapsed:
        return []  # in a gap, elapsed-time jobs run on the new time
    return [first_instant(wall, zone)]  # a fixed time in a gap: the transition


def first_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """Return the first instant (UTC) at which `zone`'s clock reads the naive `wall` or later:
    its first occurrence if it repeats, the transition if a spring-forward gap skips it."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # In a gap fold=0 reads the wall on the old offset, which lands after the transition.
    low, high = wall.replace(tzinfo=zone, fold=1).astimezone(timezone.utc), first
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).replace(tzinfo=None) < wall:
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0)


@functools.lru_cache(maxsize=8192)
def _cron_next(resolved: str, tz: str, day_and: bool, after_ms: int) -> int:
    """The next run of a cron after `after_ms`; `NEVER_MS` past year 9999; StopIteration if
    it has none in cronsim's 50 years."""
    try:
        return _cron_next_in_range(resolved, tz, day_and, after_ms)
    except OverflowError:  # cronsim or a zone's arithmetic walked past year 9999
        return NEVER_MS


def _cron_next_in_range(resolved: str, tz: str, day_and: bool, after_ms: int) -> int:
    if after_ms >= LATEST_MS:
        return NEVER_MS
    # cronsim matches calendar fields on naive wall times; the DST rule is ours
    # (`_cron_instants`). cronsim's own tz-aware mode drops a slot at Lord Howe's half-hour
    # fall-back, which tests/test_cadence.py's oracle caught.
    zone = ZoneInfo(tz)
    elapsed = _follows_elapsed_time(resolved)
    after = utc_datetime(after_ms)
    # Near a transition, start as much wall time early as the clock moves there: in a
    # repeated hour, a wall time "before" the local time of `after` can still fire after
    # it. (The shift, not a fixed 3 hours: a seconds cron walks 3 walls a minute.)
    start = after.astimezone(zone).replace(tzinfo=None)
    span = _shift_near(zone, after)
    start -= span
    overflowed: list[bool] = []
    walls = _before_overflow(_cron_walls(resolved, day_and, start), overflowed)
    best: datetime | None = None
    limit: datetime | None = None
    for wall in walls:
        if limit is not None and wall > limit:
            break
        for instant in _cron_instants(wall, zone, elapsed):
            if instant > after and (best is None or instant < best):
                best = instant
                wall_of_best = best.astimezone(zone).replace(tzinfo=None)
                limit = _wall_plus(wall_of_best, max(span, _shift_near(zone, best)))
        if best is not None and _no_transition_near(zone, after, best):
            break  # wall order is instant order away from transitions
    if best is None:
        if overflowed:
            return NEVER_MS
        raise StopIteration  # pragma: no cover - cronsim stops only after 50 years
    ms = int(best.timestamp() * 1000)
    return ms if ms <= LATEST_MS else NEVER_MS


def _before_overflow(walls: Iterator[datetime], overflowed: list[bool]) -> Iterator[datetime]:
    """`walls` until cronsim's next step would pass year 9999 (then `overflowed` is [True])."""
    try:
        yield from walls
    except OverflowError:
        overflowed.append(True)


def _offset(zone: ZoneInfo, at: datetime, shift: timedelta, fallback: timedelta) -> timedelta:
    """`zone`'s UTC offset at `at + shift`; `fallback` when that is past year 9999 (in UTC or
    on the zone's wall clock): no zone changes its clock in the last hours of 9999, so the
    last slots of that year are found like any other (they were lost to an OverflowError)."""
    try:
        offset = (at + shift).astimezone(zone).utcoffset()
    except OverflowError:
        return fallback
    assert offset is not None  # a ZoneInfo always has an offset
    return offset


def _shift_near(zone: ZoneInfo, at: datetime) -> timedelta:
    """How far `zone`'s clock moves between `at - 3h` and `at + 3h` (zero away from DST);
    3 hours when it moves and comes back within that span, which no zone does."""
    before = _offset(zone, at, -_DST_SPAN, timedelta(0))
    after = _offset(zone, at, _DST_SPAN, before)
    if before != after:
        return abs(after - before) + timedelta(seconds=1)
    if _offset(zone, at, timedelta(0), before) != before:
        return _DST_SPAN
    return timedelta(0)


def _no_transition_near(zone: ZoneInfo, start: datetime, end: datetime) -> bool:
    """True when `zone` keeps one offset from `start - 3h` to `end + 3h` and they are close."""
    if end - start > timedelta(hours=12):
        return False
    before = _offset(zone, start, -_DST_SPAN, timedelta(0))
    return before == _offset(zone, end, _DST_SPAN, before)


def _wall_plus(wall: datetime, span: timedelta) -> datetime:
    """`wall + span`, or the last wall time there is when that is past year 9999."""
    try:
        return wall + span
    except OverflowError:
        return datetime.max


def cadence_from_fields(fields: dict[str, str]) -> Cadence:
    """Rebuild a cadence from record fields; raise `ScheduleError` if they are inconsistent."""
    if fields.get("cron"):
        return Cron(
            fields["cron"],
            fields.get("tz") or "UTC",
            fields.get("day_and") == "1",
            fields.get("seed") or None,
            stored=True,
        )
    if fields.get("at"):
        try:
            return At(tuple(int(v) for v in fields["at"].split(",")))
        except ValueError as exc:
            raise ScheduleError(f"at {shown(fields['at'])} is not a list of epoch ms") from exc
    raw = fields.get("every_ms")
    if not raw:
        raise ScheduleError("record has neither every_ms nor cron")
    try:
        every_ms = int(raw)
    except ValueError as exc:
        raise ScheduleError(f"every_ms {shown(raw)} is not an integer") from exc
    # A record without `anchor` (EchoMQ's own, or older) keeps the phase it has: "schedule".
    anchor = fields.get("anchor") or "schedule"
    if anchor not in ANCHORS:
        raise ScheduleError(f"anchor {shown(anchor)} is not one of {ANCHORS}")
    try:
        offset_ms = int(fields.get("offset_ms") or 0)
    except ValueError as exc:
        raise ScheduleError(f"offset_ms {shown(fields['offset_ms'])} is not an integer") from exc
    return Every(every_ms, anchor, offset_ms)


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What the claim of one due registration does under its misfire policy (`catch_up`).

    `fire_ms`: the slot that fires now (its nominal time, the occurrence's `due_ms`), or None
    when none does. `next_ms`: the score to write, in the past while `all` catches up.
    `missed`: the slots this step drops, counted in the record's `missed` and logged.
    `passed`: the slots that had passed, the held one included (`first_ms` to `last_ms`);
    for a cron past `MAX_COUNTED_MISSES` of them, `passed` and `missed` are lower bounds.
    """

    fire_ms: int | None
    next_ms: int
    missed: int
    passed: int
    first_ms: int
    last_ms: int
    policy: str = "latest"


def misfire_policy(misfire: str) -> str:
    """Return the policy a misfire name means (`coalesce` -> `latest`, `catchup` -> `all`)."""
    if misfire not in MISFIRES:
        raise ScheduleError(f"misfire must be one of {MISFIRES}, got {shown(misfire)}")
    return MISFIRE_ALIASES.get(misfire, misfire)


def catch_up(
    cadence: Cadence,
    due_ms: int,
    now_ms: int,
    misfire: Misfire = "latest",
    *,
    window_ms: int | None = None,
    max_runs: int | None = None,
    end_ms: int | None = None,
) -> CatchUp:
    """Decide what fires for the slot `due_ms` (the score a pump holds) released at `now_ms`.

    `end_ms`, a registration's `end_at`: slots after it are none of its slots, so an outage
    across it catches up on the slots up to it only (neither fired nor counted missed past
    it; the next run is then past the end, which completes the registration).

    The slots that passed are `due_ms` and every slot of `cadence` after it up to `now_ms`.
    Those older than the catch-up window (`now - window_ms`; no bound by default, 60 s for
    `skip`) are missed. Of the others:

    * `latest` (`coalesce`, the default): the newest fires, for its own nominal time;
    * `earliest`: the oldest fires (version 1's `coalesce`);
    * `skip`: as `latest`, with a 60 s window by default: a slot that late is missed, so
      after an outage nothing fires and the registration goes on at the next future slot;
    * `all` (`catchup`): each fires, one per claim, the newest `max_runs` (default 100).

    Every slot not fired is dropped and counted in `missed`, all at the claim that sees them,
    so one outage is one count and one log line per registration. The next run is the first
    future slot, except while `all` catches up (the next slot to fire, in the past).
    An `Every` with `anchor="release"` has no grid to catch up on: the held slot fires (if
    within the window), the next run is `now + every`, and the intervals that passed count.
    """
    policy = misfire_policy(misfire)
    if window_ms is None and policy == "skip":
        window_ms = SKIP_GRACE_MS
    low = None if window_ms is None else now_ms - window_ms
    # The window counts back from now; the slots that passed end at the end bound.
    now_ms = now_ms if end_ms is None else min(now_ms, end_ms)
    keep = 1
    if policy == "all":
        keep = DEFAULT_CATCHUP_MAX if max_runs is None else max_runs
    if isinstance(cadence, Every) and cadence.anchor == "release":
        passed = 1 + max(0, now_ms - due_ms) // cadence.every_ms
        fire = due_ms if low is None or due_ms >= low else None
        missed = passed - (fire is not None)
        last = due_ms + (passed - 1) * cadence.every_ms  # the newest interval that passed
        return CatchUp(fire, now_ms + cadence.every_ms, missed, passed, due_ms, last, policy)
    if due_ms <= now_ms and (after := cadence.next_after(due_ms)) > now_ms:
        # On time, the common case: only the held slot passed (what `_passed_slots` finds).
        held = due_ms if low is None or due_ms >= low else None
        return CatchUp(held, after, 0 if held is not None else 1, 1, due_ms, due_ms, policy)
    passed, first_in, newest, last, future = _passed_slots(cadence, due_ms, now_ms, low, keep)
    fires = ([] if first_in is None else [first_in]) if policy == "earliest" else newest
    next_ms = fires[1] if len(fires) > 1 else future
    fire = fires[0] if fires else None
    return CatchUp(fire, next_ms, passed - len(fires), passed, due_ms, last, policy)


def _passed_slots(
    cadence: Cadence, due_ms: int, now_ms: int, low: int | None, keep: int
) -> tuple[int, int | None, list[int], int, int]:
    """Walk the slots from `due_ms` (held; off the cadence's grid after a cadence change or
    an `immediately`) to `now_ms`.

    Return how many passed, the oldest at or after `low` (None if none), the newest `keep`
    at or after `low` (ascending), the newest that passed, and the first after `now_ms`.
    """
    if due_ms > now_ms:  # not due yet: treated as on time
        return 1, due_ms, [due_ms], due_ms, cadence.next_after(due_ms)
    held_in = low is None or due_ms >= low
    if isinstance(cadence, Every):  # arithmetic: exact counts whatever the outage
        every, after = cadence.every_ms, cadence.next_after(due_ms)
        later = 0 if after > now_ms else (now_ms - after) // every + 1
        skip_to = 0 if low is None or after >= low else -(-(low - after) // every)
        grid = [after + i * every for i in range(max(skip_to, later - keep), later)]
        newest = ([due_ms] if held_in and len(grid) < keep else []) + grid
        if held_in:
            first_in: int | None = due_ms
        else:
            first_in = after + skip_to * every if skip_to < later else None
        last = after + (later - 1) * every if later else due_ms
        return 1 + later, first_in, newest, last, after + later * every
    window: deque[int] = deque(maxlen=keep)
    passed, first_in, slot, last = 0, None, due_ms, due_ms
    while slot <= now_ms:
        passed, last = passed + 1, slot
        if low is None or slot >= low:
            first_in = slot if first_in is None else first_in
            window.append(slot)
        if passed >= MAX_COUNTED_MISSES:
            # A very long outage: the count stops (a lower bound); the newest slots are
            # found walking back from `now` in growing spans, not slot by slot.
            tail = _newest_before(cadence, slot, now_ms, low, keep)
            if tail and first_in is None:
                first_in = tail[0]
            window.extend(tail)
            last = tail[-1] if tail else last
            return passed + len(tail), first_in, list(window), last, cadence.next_after(now_ms)
        slot = cadence.next_after(slot)
    return passed, first_in, list(window), last, slot


def _newest_before(
    cadence: Cadence, after_ms: int, now_ms: int, low: int | None, keep: int
) -> list[int]:
    """Return up to the newest `keep` slots in (after_ms, now_ms], at or after `low`."""
    floor = after_ms if low is None else max(after_ms, low - 1)
    span = 60_000
    while True:
        start = max(floor, now_ms - span)
        slots, slot = [], cadence.next_after(start)
        while slot <= now_ms:
            slots.append(slot)
            slot = cadence.next_after(slot)
        if len(slots) >= keep or start == floor:
            return slots[-keep:]
        span *= 4


def advance(
    cadence: Cadence, due_ms: int, now_ms: int, misfire: Misfire = "latest"
) -> tuple[int, int]:
    """Return `(next_ms, missed)` of `catch_up` with no window (version 1's signature)."""
    step = catch_up(cadence, due_ms, now_ms, misfire)
    return step.next_ms, step.missed


def next_runs(cadence: Cadence, after_ms: int, n: int) -> list[int]:
    """Return the next `n` slots strictly after `after_ms`."""
    runs: list[int] = []
    at = after_ms
    for _ in range(n):
        at = cadence.next_after(at)
        runs.append(at)
    return runs
