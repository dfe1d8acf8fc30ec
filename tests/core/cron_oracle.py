"""A brute-force cron oracle, independent of any cron library: the DST rule of docs/design.md.

* Expressions whose minute or hour field starts with `*` follow elapsed time: they fire at
  every instant whose local wall time matches (so none in a gap, twice in a repeated hour).
* Other (fixed-time) expressions fire once per matching local wall time: in a gap, at the
  first valid instant after it; when repeated, at its first occurrence.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

RANGES = {0: (0, 59), 1: (0, 23), 2: (1, 31), 3: (1, 12), 4: (0, 7)}


def parse_field(text: str, index: int) -> set[int]:
    low, high = RANGES[index]
    values: set[int] = set()
    for item in text.split(","):
        part, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if part == "*":
            start, end = low, high
        elif "-" in part:
            a, b = part.split("-")
            start, end = int(a), int(b)
        else:
            start = end = int(part)
        values.update(range(start, end + 1, step))
    if index == 4 and 7 in values:
        values.discard(7)
        values.add(0)
    return values


class Oracle:
    def __init__(self, expr: str, tz: str) -> None:
        fields = expr.split()
        self.minutes, self.hours, self.doms, self.months, self.dows = (
            parse_field(f, i) for i, f in enumerate(fields)
        )
        self.day_or = not (fields[2].startswith("*") or fields[4].startswith("*"))
        self.elapsed = fields[0].startswith("*") or fields[1].startswith("*")
        self.zone = ZoneInfo(tz)

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.doms
        dow = (day.isoweekday() % 7) in self.dows
        return (dom or dow) if self.day_or else (dom and dow)

    def fires(self, start: datetime, end: datetime) -> list[int]:
        """Return the firing instants (epoch ms) strictly after `start`, up to `end`."""
        if self.elapsed:
            return self._elapsed(start, end)
        return self._fixed(start, end)

    def _elapsed(self, start: datetime, end: datetime) -> list[int]:
        out = []
        at = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
        while at <= end:
            local = at.astimezone(self.zone)
            if (
                local.minute in self.minutes
                and local.hour in self.hours
                and self.day_matches(local.date())
            ):
                out.append(int(at.timestamp() * 1000))
            at += timedelta(minutes=1)
        return out

    def _instant(self, naive: datetime) -> datetime:
        first = naive.replace(tzinfo=self.zone, fold=0)
        back = first.astimezone(timezone.utc).astimezone(self.zone).replace(tzinfo=None)
        if back == naive:
            return first  # exists; for a repeated time fold=0 is its first occurrence
        # In a gap: walk UTC minutes from before the gap to the first valid local time after it.
        probe = naive.replace(tzinfo=self.zone, fold=1).astimezone(timezone.utc)
        while probe.astimezone(self.zone).replace(tzinfo=None) < naive:
            probe += timedelta(minutes=1)
        return probe

    def _fixed(self, start: datetime, end: datetime) -> list[int]:
        out: set[int] = set()
        day = start.astimezone(self.zone).date() - timedelta(days=1)
        last = end.astimezone(self.zone).date() + timedelta(days=1)
        while day <= last:
            if self.day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        instant = self._instant(
                            datetime(day.year, day.month, day.day, hour, minute)
                        )
                        if start < instant <= end:
                            out.add(int(instant.timestamp() * 1000))
            day += timedelta(days=1)
        return sorted(out)


def transitions(tz: str, year: int) -> list[datetime]:
    """Return the UTC instants (to the minute) at which `tz` changes its offset in `year`."""
    zone = ZoneInfo(tz)
    found = []
    at = datetime(year, 1, 1, tzinfo=timezone.utc)
    end = datetime(year + 1, 1, 1, tzinfo=timezone.utc)
    step = timedelta(hours=6)
    while at < end:
        if at.astimezone(zone).utcoffset() != (at + step).astimezone(zone).utcoffset():
            low, high = at, at + step
            while high - low > timedelta(minutes=1):
                mid = low + (high - low) / 2
                if mid.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset():
                    low = mid
                else:
                    high = mid
            found.append(high.replace(second=0, microsecond=0))
        at += step
    return found
