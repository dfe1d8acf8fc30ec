"""What `add` and `next` need of calendars and jitter: a calendars file, and the notes on
each upcoming run (its nominal slot when jittered, the slots the calendars skip before it)."""

from __future__ import annotations

from typing import Any

from ..cadence import Cadence
from ..calendars import Calendar, Excluding
from ..config import calendars_from_table, read_document
from ..errors import ConfigError, ScheduleError
from ..jitter import Jittered

__all__ = ["MAX_EXCLUDED_SHOWN", "MAX_WALKED", "read_calendars", "run_notes"]

# Excluded slots listed before one run, at most: a weekend off a minutely cron is thousands.
MAX_EXCLUDED_SHOWN = 3
# Slots no rule covers that the search for excluded ones walks past before it stops.
MAX_WALKED = 10_000


def read_calendars(path: str | None) -> dict[str, Calendar] | None:
    """Return the calendars of the `[calendars]` table of a TOML (or .json) file, or None.

    A schedule file works too: only its `calendars` are read. `ConfigError` if unusable.
    """
    if path is None:
        return None
    # Read as a schedule file (which is a calendars file too): bounded, no FIFO, no
    # /dev/zero, a JSON key given twice and nesting too deep refused in one line.
    data = read_document(path, "the calendars")
    if not isinstance(data, dict) or "calendars" not in data:
        raise ConfigError(f"{path}: no [calendars] table")
    try:
        return calendars_from_table(data["calendars"])
    except ScheduleError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def run_notes(
    cadence: Cadence, runs: list[int], after_ms: int | None = None
) -> list[dict[str, Any]]:
    """Return, per run, its nominal slot (`nominal_ms`, when jittered) and the slots the
    cadence's exclusions skipped since the run before (since `after_ms` for the first):
    `excluded_ms`, at most `MAX_EXCLUDED_SHOWN`, and `excluded_more` when there were more."""
    nominal = cadence.nominal if isinstance(cadence, Jittered) else None
    excluding = cadence.inner if isinstance(cadence, Jittered) else cadence
    notes: list[dict[str, Any]] = []
    previous = after_ms
    for run in runs:
        slot = run if nominal is None else nominal(run)
        note: dict[str, Any] = {} if nominal is None else {"nominal_ms": slot}
        if isinstance(excluding, Excluding) and previous is not None:
            skipped, more = _excluded_between(excluding, previous, slot)
            note["excluded_ms"], note["excluded_more"] = skipped, more
        notes.append(note)
        previous = slot
    return notes


def _excluded_between(cadence: Excluding, after: int, before: int) -> tuple[list[int], bool]:
    """Return the slots of `cadence`'s inner cadence in `(after, before)` an exclusion rule
    covers (at most `MAX_EXCLUDED_SHOWN`, and whether there are more). A slot no rule covers
    is not listed: it did not fire for another reason (before `start_at`, say). The walk
    stops after `MAX_WALKED` slots no rule covers (a 1 s schedule whose `start_at` is weeks
    ahead)."""
    skipped: list[int] = []
    walked = 0
    at = cadence.inner.next_after(after)
    while at < before:
        if cadence.excluded_until(at) is None:
            walked += 1
            if walked > MAX_WALKED:
                break
        elif len(skipped) == MAX_EXCLUDED_SHOWN:
            return skipped, True
        else:
            skipped.append(at)
        at = cadence.inner.next_after(at)
    return skipped, False
