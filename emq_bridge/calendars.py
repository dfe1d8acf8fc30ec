"""Calendars: slots a schedule must not fire at (holidays, freeze windows). Pure math.

An exclusion rule is one string, read in the schedule's zone (a cron's `tz`; UTC for an
interval):

* `2026-12-25`: that whole day;
* `2026-12-20..2027-01-03`: every day from the first to the last, both included;
* `2026-11-27T18:00..2026-11-30T06:00`: a window of wall time, its end excluded;
* `cron:* * * * 0,6`: every minute (every second, for 6 fields) the expression matches,
  here the weekends.

A `Calendar` is a named list of rules several schedules share. It is declared where the
schedules are (Python, the schedule file) and resolved into each definition: the record
holds the rules themselves (`exclude`, JSON) and the calendars' names (`calendars`), so the
pump's next-run math needs no other key and a changed calendar changes the digest of every
schedule using it, which the next sync rewrites. `Excluding` wraps a cadence and skips the
excluded slots; a skipped slot is not a missed one (it was never due).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Union
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from .cadence import LATEST_MS, MAX_CRON_CHARS, NEVER_MS, Cadence, first_instant
from .errors import ScheduleError
from .keys import validate_name
from .millis import instant_ms

__all__ = [
    "MAX_RULES",
    "Calendar",
    "ExcludeItem",
    "Excluding",
    "exclusion_from_fields",
    "resolve_exclude",
]

# Rules per definition, after calendars are expanded: a calendar is a list of dates, not a
# data set, and every claim of the schedule may test each.
MAX_RULES = 1000
# Excluded slots skipped in one search before the schedule is taken to never fire again.
MAX_SKIPS = 20_000

_DATE = r"\d{4}-\d{2}-\d{2}"
_WALL = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2})?"
_DATE_RE = re.compile(_DATE, re.ASCII)
_DAYS_RE = re.compile(rf"({_DATE})\.\.({_DATE})", re.ASCII)
_WINDOW_RE = re.compile(rf"({_WALL})\.\.({_WALL})", re.ASCII)


@dataclass(frozen=True, slots=True)
class Calendar:
    """A named list of exclusion rules that several schedules share (see the module doc)."""

    name: str
    exclude: tuple[str, ...]

    def __init__(self, name: str, exclude: Iterable[str]) -> None:
        validate_name(name, "calendar name")
        if isinstance(exclude, str):
            raise ScheduleError(f"calendar {name!r}: exclude must be a list of rules")
        rules = tuple(exclude)
        for rule in rules:
            _parse(rule)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "exclude", rules)


ExcludeItem = Union[str, Calendar]  # noqa: UP007 - a runtime alias, read by mypy and users


def resolve_exclude(
    items: Iterable[ExcludeItem] | ExcludeItem | None,
    calendars: Mapping[str, Calendar] | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return (rules, calendar names) of an `exclude=` list: rules, `Calendar`s, `@name`s.

    `@name` is looked up in `calendars` (the schedule file's `[calendars]`). Raises
    `ScheduleError` on a malformed rule, an unknown calendar or too many rules.
    """
    if items is None:
        return (), ()
    if isinstance(items, str | Calendar):
        items = [items]
    rules: list[str] = []
    names: list[str] = []
    for given in items:
        item = given
        if isinstance(item, str) and item.startswith("@"):
            found = (calendars or {}).get(item[1:])
            if found is None:
                known = ", ".join(sorted(calendars or {})) or "none declared"
                raise ScheduleError(f"exclude {item!r}: no such calendar ({known})")
            item = found
        if isinstance(item, Calendar):
            names.append(item.name)
            rules.extend(item.exclude)
        elif isinstance(item, str):
            _parse(item)
            rules.append(item.strip())
        else:
            raise ScheduleError(
                f"exclude takes dates, ranges, 'cron:' rules or calendars, not {item!r}"
            )
    unique = tuple(dict.fromkeys(rules))
    if len(unique) > MAX_RULES:
        raise ScheduleError(f"exclude has {len(unique)} rules; the limit is {MAX_RULES}")
    return unique, tuple(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class _Days:
    first: date
    last: date

    def until(self, wall: datetime) -> datetime | None:
        if self.first <= wall.date() <= self.last:
            return datetime.combine(self.last + timedelta(days=1), datetime.min.time())
        return None


@dataclass(frozen=True, slots=True)
class _Window:
    start: datetime
    end: datetime

    def until(self, wall: datetime) -> datetime | None:
        return self.end if self.start <= wall < self.end else None


@dataclass(frozen=True, slots=True)
class _Matching:
    expr: str
    seconds: bool

    def until(self, wall: datetime) -> datetime | None:
        step = timedelta(seconds=1) if self.seconds else timedelta(minutes=1)
        start = wall if self.seconds else wall.replace(second=0)
        if next(iter(CronSim(self.expr, start - timedelta(seconds=1)))) == start:
            return start + step
        return None


_Rule = _Days | _Window | _Matching


def _parse(rule: object) -> _Rule:
    if not isinstance(rule, str):
        raise ScheduleError(f"an exclude rule must be a string, not {rule!r}")
    text = rule.strip()
    try:
        if text.startswith("cron:"):
            expr = text[5:].strip()
            if len(expr) > MAX_CRON_CHARS or len(expr.split()) not in (5, 6):
                raise ValueError("a 'cron:' rule takes 5 fields, or 6 with seconds first")
            CronSim(expr, datetime(2000, 1, 1))
            return _Matching(expr, len(expr.split()) == 6)
        if _DATE_RE.fullmatch(text):
            day = date.fromisoformat(text)
            return _Days(day, day)
        if match := _DAYS_RE.fullmatch(text):
            first, last = (date.fromisoformat(g) for g in match.groups())
            if last < first:
                raise ValueError("the range ends before it starts")
            return _Days(first, last)
        if match := _WINDOW_RE.fullmatch(text):
            start, end = (datetime.fromisoformat(g) for g in match.groups())
            if end <= start:
                raise ValueError("the window ends before it starts")
            return _Window(start, end)
    except (ValueError, CronSimError) as exc:
        raise ScheduleError(f"exclude rule {text[:80]!r}: {exc}") from None
    raise ScheduleError(
        f"exclude rule {text[:80]!r} is not a date (2026-12-25), a range of days "
        "(2026-12-20..2027-01-03), a window (2026-11-27T18:00..2026-11-30T06:00) "
        "or 'cron:<fields>'"
    )


@dataclass(frozen=True, slots=True)
class Excluding:
    """`inner`'s slots, less those whose wall time in `tz` an exclusion rule covers."""

    inner: Cadence
    rules: tuple[str, ...]
    tz: str = "UTC"
    calendars: tuple[str, ...] = ()
    _parsed: tuple[_Rule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.rules:
            raise ScheduleError("an exclusion needs at least one rule")
        object.__setattr__(self, "_parsed", tuple(_parse(r) for r in self.rules))

    @property
    def kind(self) -> str:
        return self.inner.kind

    def excluded_until(self, slot_ms: int) -> int | None:
        """None if `slot_ms` may fire, else the instant its exclusion ends (epoch ms;
        `NEVER_MS` for an exclusion that lasts past year 9999)."""
        if slot_ms > LATEST_MS:
            return None  # no slot (`NEVER_MS`): nothing to exclude
        zone = ZoneInfo(self.tz)
        wall = datetime.fromtimestamp(slot_ms / 1000, tz=timezone.utc).astimezone(zone)
        naive = wall.replace(tzinfo=None, microsecond=0)
        end: datetime | None = None
        try:
            for rule in self._parsed:
                until = rule.until(naive)
                if until is not None and (end is None or until > end):
                    end = until
            if end is None:
                return None
            # The first instant at that wall time or after (in a gap, the transition itself).
            return instant_ms(first_instant(end, zone))
        except OverflowError:  # the exclusion ends after 9999-12-31
            return NEVER_MS

    def _admit(self, slot: int) -> int:
        for _ in range(MAX_SKIPS):
            end = self.excluded_until(slot)
            if end is None:
                return slot
            slot = self.inner.next_after(max(slot, end - 1))
        raise ScheduleError(f"the exclusions skip more than {MAX_SKIPS} runs in a row")

    def first_run(self, now_ms: int) -> int:
        return self._admit(self.inner.first_run(now_ms))

    def next_after(self, after_ms: int) -> int:
        return self._admit(self.inner.next_after(after_ms))

    def to_fields(self) -> dict[str, str]:
        fields = {**self.inner.to_fields(), "exclude": json.dumps(list(self.rules))}
        if self.calendars:
            fields["calendars"] = json.dumps(list(self.calendars))
        return fields

    def describe(self) -> str:
        names = ", ".join(self.calendars)
        what = f"calendars {names}" if names else f"{len(self.rules)} exclusion rule(s)"
        return f"{self.inner.describe()}, except {what}"


def exclusion_from_fields(inner: Cadence, fields: Mapping[str, str]) -> Cadence:
    """Wrap `inner` in the record's exclusions, if it has any; `ScheduleError` if corrupt."""
    raw = fields.get("exclude")
    if not raw:
        return inner
    try:
        rules = json.loads(raw)
        names = json.loads(fields.get("calendars") or "[]")
    except ValueError as exc:
        raise ScheduleError(f"exclude {raw[:80]!r} is not JSON") from exc
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ScheduleError("exclude must be a JSON list of rules")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ScheduleError("calendars must be a JSON list of names")
    return Excluding(inner, tuple(rules), fields.get("tz") or "UTC", tuple(names))
