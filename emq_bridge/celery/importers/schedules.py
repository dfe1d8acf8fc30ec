"""Carry one Celery schedule object over: its emq-bridge cadence and the slot it fires next.

Celery side (it reads Celery schedule objects); used by the redbeat and django-celery-beat
importers. Intervals and crontabs go through the Celery adapter's own conversion
(`emq_bridge.celery.entries.convert_schedule`); a celery-redbeat `rrule` becomes an interval
or a cron when one gives exactly its slots (checked on the next `RRULE_CHECKED_SLOTS`
slots; `until` and `count` become an end bound, at the rrule's last slot), else it is
refused.
A fixed-length rrule (SECONDLY to WEEKLY, any `interval`, no `by*` part) is an interval on
its own grid (`offset` = its dtstart modulo the interval), so the phase is part of the
definition, not only of the seeded next run. Schedules only Celery's `is_due` can decide
(solar, relative intervals, custom classes) need the object in the beat's process: they
are refused with what to write in `beat_schedule` instead.

The next slot follows the old scheduler's rule (Celery's `is_due` from the last run): an
interval fires `every` after its last run, a crontab at its first slot after it; never run,
or overdue, it fires at once, as redbeat would (an overdue interval at the latest slot of its
rhythm not after now, which keeps its phase; a crontab at `now`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import islice
from typing import Any

from celery import Celery
from celery.schedules import schedule

from ...bounds import Bounds
from ...cadence import Cadence, Cron, Every
from ...errors import EmqError
from ...millis import instant_ms
from ..entries import CelerySchedule, convert_schedule

__all__ = ["RRULE_CHECKED_SLOTS", "Carried", "Unrepresentable", "carry", "epoch_ms"]

# An rrule is carried only if its cadence gives the same next slots as the rrule, this many.
RRULE_CHECKED_SLOTS = 64
# dateutil's frequencies (YEARLY=0 ... SECONDLY=6) and the interval steps of the fixed ones.
_YEARLY, _MONTHLY, _WEEKLY, _DAILY, _HOURLY, _MINUTELY, _SECONDLY = range(7)
_STEP_MS = {
    _WEEKLY: 604_800_000,
    _DAILY: 86_400_000,
    _HOURLY: 3_600_000,
    _MINUTELY: 60_000,
    _SECONDLY: 1000,
}


class Unrepresentable(Exception):
    """A schedule emq-bridge cannot carry; the message says why and what to do."""


def epoch_ms(value: datetime) -> int:
    """Return an aware (or UTC naive) datetime in epoch ms, rounded up: never a hair early."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return instant_ms(value, ceil=True)


@dataclass(frozen=True, slots=True)
class Carried:
    """A Celery schedule carried over: its cadence, its next slot (epoch ms: at or after
    now, or a past slot that fires at once) and the bounds it brings (an rrule's)."""

    cadence: Cadence
    first_run_ms: int
    end_ms: int | None = None
    limit: int | None = None
    # An overdue interval's latest slot on the rhythm of its last run, not after now, where
    # `first_run_ms` is now (`Seed.rhythm_ms`); else None.
    rhythm_ms: int | None = None

    def bounds(self, start_ms: int | None = None, end_ms: int | None = None) -> Bounds:
        """Return its bounds, with a start and an earlier end given by the row."""
        ends = [e for e in (self.end_ms, end_ms) if e is not None]
        return Bounds(start_ms, min(ends) if ends else None, self.limit)


def carry(value: Any, app: Celery, label: str, *, last_run_ms: int | None, now_ms: int) -> Carried:
    """Return Celery schedule `value` carried over; raise `Unrepresentable` if it has no
    equivalent.

    `last_run_ms` is the schedule's last run (None: it never ran, so it fires at once).
    """
    if _is_rrule(value):
        _check_rrule(value)
        return _rrule(value, last_run_ms, now_ms)
    if isinstance(value, schedule) and not isinstance(value.run_every, timedelta):
        # celery-redbeat's decoder passes a non-number `every` through as it is.
        raise Unrepresentable(f"its interval is {value.run_every!r}, not a number of seconds")
    try:
        cadence = convert_schedule(value, app, label)
    except EmqError as exc:
        raise Unrepresentable(str(exc)) from exc
    if isinstance(cadence, CelerySchedule):
        raise Unrepresentable(
            f"{cadence.label} is decided by Celery's is_due in the process that holds the "
            "object, which an imported registration has not: declare it in beat_schedule "
            "(emq-bridge's beat checks it there)"
        )
    if isinstance(cadence, Every):
        # Celery runs an interval `every` after its last run: the phase of the seed, kept
        # from one run to the next (`anchor="schedule"`), not an epoch grid.
        cadence = Every(cadence.every_ms, "schedule")
    if last_run_ms is None:
        return Carried(cadence, now_ms)
    if isinstance(cadence, Every):
        following = last_run_ms + cadence.every_ms
        if following <= now_ms:
            # Overdue: it fires at once and runs on an interval after that, as Celery's beat
            # runs an overdue entry (its last run becomes the late one); the slot it had
            # fired at, one `every` after the last run, would come less than an interval
            # later. A cut-over that resumes it later (`Repeat.resume(seed=...)`, a passed
            # slot stepped past) keeps the old rhythm instead: the latest of its slots not
            # after now, so that the slot redbeat would fire next is not dropped.
            rhythm = following + (now_ms - following) // cadence.every_ms * cadence.every_ms
            return Carried(cadence, now_ms, rhythm_ms=rhythm)
        return Carried(cadence, following)
    following = cadence.next_after(last_run_ms)
    return Carried(cadence, max(following, now_ms))


def _is_rrule(value: Any) -> bool:
    return type(value).__name__ == "rrule" and hasattr(value, "rrule") and hasattr(value, "freq")


def _check_rrule(value: Any) -> None:
    """Raise `Unrepresentable` for a frequency or weekday dateutil has not (celery-redbeat
    builds the rrule with it; dateutil fails only while walking it, with a KeyError)."""
    freq = value.freq
    if type(freq) is not int or not _YEARLY <= freq <= _SECONDLY:
        raise Unrepresentable(
            f"the rrule's freq {freq!r} is not one of dateutil's, 0 (YEARLY) to 6 (SECONDLY)"
        )
    interval = getattr(value, "interval", 1)
    if type(interval) is not int or interval < 1:  # 0: dateutil repeats dtstart for ever
        raise Unrepresentable(f"the rrule's interval {interval!r} is not a whole number from 1")
    raw = value.byweekday
    items = [] if raw is None else raw if isinstance(raw, (list, tuple)) else [raw]
    for item in [*items, value.wkst]:
        number: Any = getattr(item, "weekday", item)
        if item is not None and (type(number) is not int or not 0 <= number <= 6):
            raise Unrepresentable(
                f"the rrule's weekday {number!r} is not one of dateutil's, 0 (MO) to 6 (SU)"
            )


def _fixed_step(value: Any) -> Carried | None:
    """The grid interval of a fixed-step rrule (no `by*` part) whose dtstart is in UTC or a
    fixed offset, where its slots are exactly dtstart + k * step; else None. Its slots are
    then computed, not walked from dtstart (a minutely rrule started a year ago has half a
    million slots before now, which dateutil's `after` walks at each call)."""
    cadence = _rrule_cadence(value)
    dtstart: datetime = value.dtstart
    if not isinstance(cadence, Every) or not isinstance(dtstart.tzinfo, timezone):
        return None
    if any(getattr(value, n, None) not in (None, (), []) for n in _BY):
        return None
    return Carried(cadence, epoch_ms(dtstart.replace(microsecond=0)))


def _fixed_step_rrule(
    value: Any, grid: Carried, last_run_ms: int | None, now_ms: int
) -> Carried | None:
    """`_rrule` for a fixed-step rrule (`_fixed_step`), by arithmetic on its slots."""
    every, first_slot = grid.cadence.every_ms, grid.first_run_ms  # type: ignore[attr-defined]
    count = getattr(value, "count", None) or None
    last_slot = first_slot + (count - 1) * every if count else None
    until = getattr(value, "until", None)
    end_ms = epoch_ms(until) if until else None
    if end_ms is not None:
        until_slot = first_slot + (end_ms - first_slot) // every * every
        last_slot = until_slot if last_slot is None else min(last_slot, until_slot)
    # The slot after the last run (redbeat's "never ran" is before any slot).
    k = (
        0
        if last_run_ms is None or last_run_ms < first_slot
        else (last_run_ms - first_slot) // every + 1
    )
    following = first_slot + k * every
    if last_slot is not None and following > last_slot:
        return None
    first = following
    if first <= now_ms:  # overdue: the latest slot not after now fires at once
        first = first_slot + (now_ms - first_slot) // every * every
        if last_slot is not None:
            first = min(first, last_slot)
    ends = [e for e in (end_ms, last_slot if count else None) if e is not None]
    return Carried(grid.cadence, first, min(ends) if ends else None)


def _rrule(value: Any, last_run_ms: int | None, now_ms: int) -> Carried:
    """Carry a celery-redbeat `rrule`: an interval on its grid, or a cron, if exact; its
    `until` becomes an end bound, and so does its `count` (at its last slot)."""
    grid = _fixed_step(value)
    if grid is not None:
        carried = _fixed_step_rrule(value, grid, last_run_ms, now_ms)
        if carried is None:
            raise Unrepresentable("the rrule has no slot after its last run: nothing left to fire")
        return carried
    return _rrule_walked(value, last_run_ms, now_ms)


_WEEK = timedelta(weeks=1)


def _walked_from(value: Any, since: datetime) -> Any:
    """The rrule to walk for slots after `since`: `value`'s own, or, for one with no count, an
    interval of 1 at a weekly or finer frequency and a dtstart in UTC or a fixed offset, the
    same rule started whole weeks later, a week before `since` (its slots from there on are
    the same: each week repeats the one before), so dateutil does not walk every slot since
    a dtstart long past (a minutely rule of some hours, started a year ago, took minutes)."""
    rule, dtstart = value.rrule, value.dtstart
    if getattr(value, "count", None) or int(value.interval or 1) != 1 or int(value.freq) < _WEEKLY:
        return rule
    if not isinstance(dtstart.tzinfo, timezone):
        return rule
    until = getattr(value, "until", None)
    if isinstance(until, datetime) and until.tzinfo is not None and until < since:
        since = until  # no slot after it: the week before it holds the last ones
    weeks = (since - dtstart) // _WEEK - 1
    if weeks <= 0:
        return rule
    return rule.replace(dtstart=dtstart + weeks * _WEEK)


def _rrule_walked(value: Any, last_run_ms: int | None, now_ms: int) -> Carried:
    """`_rrule` by dateutil's own walk of the rrule's slots (any rrule)."""
    end_ms = epoch_ms(value.until) if getattr(value, "until", None) else None
    now = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)
    start = (
        datetime.fromtimestamp(last_run_ms / 1000, tz=timezone.utc)
        if last_run_ms is not None
        else datetime(1, 1, 2, tzinfo=timezone.utc)  # redbeat's "never ran"
    )
    zone = value.dtstart.tzinfo
    following = _walked_from(value, min(start, now)).after(start.astimezone(zone))
    if following is None:
        raise Unrepresentable("the rrule has no slot after its last run: nothing left to fire")
    cadence = _rrule_cadence(value)
    if cadence is None:
        raise Unrepresentable(f"{value!r} has no exact cron or interval equivalent")
    first = epoch_ms(following)
    if first <= now_ms:
        # Overdue: redbeat fires it at once, then goes on from the rrule's next slot. The
        # latest slot not after now fires at once and keeps the grid.
        latest = _walked_from(value, now).before(now.astimezone(zone), inc=True)
        first = epoch_ms(latest) if latest is not None else now_ms
    slots = [first]
    for _ in range(RRULE_CHECKED_SLOTS - 1):
        slots.append(cadence.next_after(slots[-1]))
    at = datetime.fromtimestamp(first / 1000, tz=timezone.utc)
    # One walk for the next slots (each `after` would walk again from dtstart).
    later = (slot for slot in _walked_from(value, at) if slot > at)
    expected = [first, *(epoch_ms(slot) for slot in islice(later, RRULE_CHECKED_SLOTS - 1))]
    if slots[: len(expected)] != expected:
        raise Unrepresentable(f"{value!r} has no exact cron or interval equivalent")
    if getattr(value, "count", None):
        # A count ends the rrule at its last slot: an end bound there, not a limit of the
        # runs left, which depends on when it is read (a second import would lower it by
        # the runs made since, on top of those the registration counted). Finite: it ends.
        tail = deque(value.rrule, maxlen=1)  # its last slot
        if tail:
            ends = [e for e in (end_ms, epoch_ms(tail[0])) if e is not None]
            end_ms = min(ends)
    return Carried(cadence, first, end_ms)


def _rrule_cadence(value: Any) -> Cadence | None:
    """Return an interval or a cron that may give the rrule's slots (checked by the caller)."""
    if any(getattr(value, n, None) for n in ("bysetpos", "byyearday", "byeaster", "byweekno")):
        return None
    dtstart: datetime = value.dtstart
    offset = dtstart.utcoffset() or timedelta(0)
    by = {n: getattr(value, n, None) for n in _BY}
    freq, interval = int(value.freq), int(value.interval or 1)
    if not any(v not in (None, (), []) for v in by.values()) and freq in _STEP_MS:
        # A fixed-length step: the rrule's slots are dtstart + k * every, the grid of
        # `offset = dtstart mod every` (in UTC or a fixed offset, as redbeat stores it), so
        # the definition itself holds the phase: a file it is exported to, synced afresh,
        # keeps the same slots. (dateutil drops dtstart's microseconds: so does the grid.)
        every_ms = _STEP_MS[freq] * interval
        phase = epoch_ms(dtstart.replace(microsecond=0)) % every_ms
        try:
            return Every(every_ms, "grid", phase)
        except EmqError:  # a step past the longest interval
            return None
    zone = _fixed_zone(offset)
    if zone is None or interval != 1 or freq == _SECONDLY:
        return None
    seconds = _values(by["bysecond"]) or [dtstart.second]
    if seconds != [0]:
        return None  # a cron has minutes, not seconds
    minute = _values(by["byminute"]) or (None if freq >= _MINUTELY else [dtstart.minute])
    hour = _values(by["byhour"]) or (None if freq >= _HOURLY else [dtstart.hour])
    weekdays = _weekdays(by["byweekday"])
    if weekdays is None:
        return None
    monthdays = _values(by["bymonthday"])
    months = _values(by["bymonth"])
    if freq == _WEEKLY and not weekdays:
        weekdays = [(dtstart.weekday() + 1) % 7]
    if freq == _MONTHLY and not weekdays and not monthdays:
        monthdays = [dtstart.day]
    if freq == _YEARLY:
        months = months or [dtstart.month]
        if not weekdays and not monthdays:
            monthdays = [dtstart.day]
    if any(d < 1 for d in monthdays or []):
        return None  # cron has no "last day of the month"
    expr = " ".join(
        _cron_field(v) for v in (minute, hour, monthdays or None, months or None, weekdays or None)
    )
    try:
        return Cron(expr, zone, bool(weekdays and monthdays))
    except EmqError:
        return None


_BY = ("bymonth", "bymonthday", "byweekday", "byhour", "byminute", "bysecond")


def _values(raw: Any) -> list[int]:
    if raw is None:
        return []
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    return sorted(int(v) for v in items)


def _weekdays(raw: Any) -> list[int] | None:
    """Return cron weekdays (0 Sunday) of an rrule's byweekday; None for an nth weekday."""
    if raw is None:
        return []
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    out = []
    for item in items:
        if getattr(item, "n", None):
            return None  # "the 2nd Monday": cron cannot say it
        number: Any = getattr(item, "weekday", item)
        number = int(number)
        out.append((number + 1) % 7)
    return sorted(out)


def _cron_field(values: list[int] | None) -> str:
    return "*" if not values else ",".join(str(v) for v in values)


def _fixed_zone(offset: timedelta) -> str | None:
    """Return the IANA zone of a fixed UTC offset in whole hours (Etc/GMT-2 is UTC+2)."""
    seconds = int(offset.total_seconds())
    if seconds == 0:
        return "UTC"
    if seconds % 3600:
        return None
    return f"Etc/GMT{-seconds // 3600:+d}"
