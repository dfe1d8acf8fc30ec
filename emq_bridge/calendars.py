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
from datetime import date, datetime, time, timedelta, timezone
from typing import Union
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from .cadence import (
    LATEST_MS,
    MAX_CRON_CHARS,
    NEVER_MS,
    Cadence,
    Cron,
    check_cron_steps,
    first_instant,
)
from .errors import ScheduleError
from .keys import validate_name
from .millis import instant_ms, iso_utc

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
# Excluded spans jumped over in one search before the schedule is taken to never fire
# again (each jump passes a whole span a rule covers, however many slots it holds).
MAX_SKIPS = 20_000
# Days of a span a `cron:` rule covers whole that one jump passes: a longer span (a rule
# that matches every day of most of a year) takes several.
MAX_RUN_DAYS = 1000
# What `until` returns for a rule that covers every wall time from then on.
_FOREVER = datetime.max
# 400 Gregorian years: 146,097 days, whole weeks, so every date falls on the same weekday
# again and a cron, or a `cron:` rule, matches the same wall times shifted by this.
_CYCLE_MS = 146_097 * 86_400_000
# Excluded slots in a row before the search asks whether the rest repeat what it has seen:
# ordinary cadences never get there.
_CYCLE_CHECK_AFTER = 100

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
    elif not isinstance(items, Iterable):
        raise ScheduleError(
            f"exclude must be a list of rules, calendars or @names, got {type(items).__name__}"
        )
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
    _sim: CronSim = field(init=False, repr=False, compare=False)
    # The rule's fields as cronsim parsed them, read below (the time fields are plain sets;
    # the day fields, with L, W and #, are matched by cronsim's own `match_day`).
    _day_gap: time | None = field(init=False, repr=False, compare=False)
    _every_day: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sim = CronSim(self.expr, datetime(2000, 1, 1))
        object.__setattr__(self, "_sim", sim)
        object.__setattr__(self, "_day_gap", self._gap(time()))  # None: it matches all day
        dom = set(range(1, 32)) <= sim.days
        dow = {d % 7 for d in sim.weekdays if isinstance(d, int)} == set(range(7))
        days = (dom and dow) if sim.day_and else (dom or dow)
        object.__setattr__(self, "_every_day", len(sim.months) == 12 and days)

    def _day(self, day: date) -> bool:
        return day.month in self._sim.months and self._sim.match_day(day)

    def _gap(self, at: time) -> time | None:
        """The first time of day at or after `at` (whole minutes for 5 fields) the time
        fields do not match; None when they match the rest of the day. At most one pass
        over the hours and minutes: no walk over every second."""
        sim = self._sim
        seconds = sim.seconds if self.seconds else None
        whole_hour = len(sim.minutes) == 60 and (seconds is None or len(seconds) == 60)
        hour, minute, second = at.hour, at.minute, at.second if self.seconds else 0
        while hour < 24:
            if hour not in sim.hours:
                return time(hour, minute, second)
            while minute < 60:
                if minute not in sim.minutes:
                    return time(hour, minute, second)
                if seconds is not None:
                    for each in range(second, 60):
                        if each not in seconds:
                            return time(hour, minute, each)
                if whole_hour:
                    break  # every minute and second of the hour matches: the rest of it too
                minute, second = minute + 1, 0
            hour, minute, second = hour + 1, 0, 0
        return None

    def until(self, wall: datetime) -> datetime | None:
        """The end of the run of wall times the rule matches from `wall`: the first one it
        does not match (one step each, a second or a minute), or None if it does not match
        `wall`. A whole excluded span (a Monday of a 6-field rule: 86,400 seconds) is one
        answer, not one per slot; a span longer than `MAX_RUN_DAYS` days ends there (the
        caller asks again from there). OverflowError past year 9999."""
        start = wall if self.seconds else wall.replace(second=0)
        if not self._day(start.date()):
            return None
        gap = self._gap(start.time())
        if gap == start.time():
            return None  # `wall` itself does not match
        day = start.date()
        if gap is not None:
            return datetime.combine(day, gap)
        if self._day_gap is not None:  # the run reaches midnight and ends the next day
            day += timedelta(days=1)
            return datetime.combine(day, self._day_gap if self._day(day) else time())
        if self._every_day:
            return _FOREVER  # every second of every day: past year 9999
        for _ in range(MAX_RUN_DAYS):
            day += timedelta(days=1)
            if not self._day(day):
                break
        return datetime.combine(day, time())


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
            check_cron_steps(expr.split())  # a step past its field, as a schedule's cron
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
        `NEVER_MS` for an exclusion that lasts past year 9999): the end of the whole span
        of wall time the covering rules exclude from there, not just of that slot."""
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
            if end == _FOREVER:
                return NEVER_MS
            # The first instant at that wall time or after (in a gap, the transition itself).
            return instant_ms(first_instant(end, zone))
        except OverflowError:  # the exclusion ends after 9999-12-31
            return NEVER_MS

    def _admit(self, slot: int, *, to_the_end: bool) -> int:
        """The first slot from `slot` on that no rule excludes, jumping over each excluded
        span at once. An exclusion lasting past year 9999, or excluded slots up to the last
        one a cron or an interval has (a yearly cron's every 1 January), leave `NEVER_MS`
        (no slot) when `to_the_end`, else are refused (`ScheduleError`): a definition with
        no run left. One-off instants (`at`) simply end: past the last, a schedule is
        completed, as without exclusions."""
        first, repeats_from = slot, None
        for skipped in range(MAX_SKIPS):
            end = self.excluded_until(slot)
            if end is None:
                if slot < NEVER_MS or slot == first or to_the_end or self.kind == "at":
                    return slot
                end = NEVER_MS  # the cadence has no slot left: all were excluded
            if skipped == _CYCLE_CHECK_AFTER:
                repeats_from = self._repeats_from(first)
            if repeats_from is not None and slot - _CYCLE_MS >= repeats_from:
                end = NEVER_MS  # a whole cycle excluded: every later one is too (see below)
            if end >= NEVER_MS:
                if to_the_end:
                    return NEVER_MS
                raise ScheduleError(
                    f"the exclusions cover every run from {_iso(first)} to the end of year "
                    "9999: the schedule would never run (use end_at to end a schedule)"
                )
            slot = self.inner.next_after(max(slot, end - 1))
        raise ScheduleError(
            f"the exclusions skip more than {MAX_SKIPS} runs in a row from {_iso(first)}: "
            "the schedule would run rarely if ever (a rule that matches every run it has, "
            "such as the cadence's own cron, excludes them all)"
        )

    def _repeats_from(self, first_ms: int) -> int | None:
        """Where the excluded slots start to repeat every 400 years, if they do: a cron in
        UTC (no clock change moves a slot off its wall time), once every date and window
        rule has ended. A slot past that plus `_CYCLE_MS` has a twin 400 years earlier at
        the same wall time, which the cron matched and a `cron:` rule excluded: a search
        that excluded every slot of a whole cycle would exclude every slot after it (a
        yearly cron, a leap day). None when that does not hold: the search goes on."""
        if self.tz != "UTC" or not isinstance(self.inner, Cron):
            return None
        start = first_ms
        for rule in self._parsed:
            try:
                if isinstance(rule, _Days):
                    ends = datetime.combine(rule.last + timedelta(days=1), time())
                elif isinstance(rule, _Window):
                    ends = rule.end
                else:
                    continue
            except OverflowError:  # past year 9999: `excluded_until` says NEVER_MS
                return None
            start = max(start, instant_ms(ends.replace(tzinfo=timezone.utc)))
        return start

    def admit(self, slot_ms: int) -> int:
        """Return the first of `inner`'s slots from `slot_ms` (one of them) on that no rule
        excludes: `slot_ms` itself if none does (`NEVER_MS` if none is left)."""
        return self._admit(slot_ms, to_the_end=True)

    def first_run(self, now_ms: int) -> int:
        # A definition being written: one that would never run is refused.
        return self._admit(self.inner.first_run(now_ms), to_the_end=False)

    def next_after(self, after_ms: int) -> int:
        # A schedule running: past its last run there is none (`NEVER_MS`), as past 9999.
        return self._admit(self.inner.next_after(after_ms), to_the_end=True)

    def to_fields(self) -> dict[str, str]:
        fields = {**self.inner.to_fields(), "exclude": json.dumps(list(self.rules))}
        if self.calendars:
            fields["calendars"] = json.dumps(list(self.calendars))
        return fields

    def describe(self) -> str:
        names = ", ".join(self.calendars)
        what = f"calendars {names}" if names else f"{len(self.rules)} exclusion rule(s)"
        return f"{self.inner.describe()}, except {what}"


def _iso(ms: int) -> str:
    return iso_utc(ms)


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
