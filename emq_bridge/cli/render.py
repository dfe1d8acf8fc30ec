"""Turn registrations and plans into text for people and JSON for scripts."""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from ..cadence import LATEST_MS, At, Cadence, Cron, Every, misfire_policy
from ..calendars import Excluding
from ..jitter import Jittered, base_cadence
from ..keys import parse_lease_member
from ..millis import utc_datetime
from ..outcome import HistoryEntry
from ..registry import Registration
from ..shown import printable

__all__ = [
    "StoredOrder",
    "absolute",
    "cadence_text",
    "computed_by",
    "duration_text",
    "history_row",
    "inflight_json",
    "iso",
    "last_error_text",
    "registration_json",
    "relative",
    "state",
    "state_text",
    "status_text",
    "table",
    "to_json",
    "upcoming",
    "utc_iso",
    "zone_of",
]


class StoredOrder(dict[str, Any]):
    """A user's data in the order it is stored (a template: the order of its keys is part
    of it, a reorder is a change), which `to_json` prints as it is, not sorted."""


_UNITS = (("day", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000))


def zone_of(cadence: Cadence) -> ZoneInfo:
    """Return the time zone a cadence's times are shown in: a cron's own, else UTC."""
    cadence = base_cadence(cadence)  # under its jitter and calendars
    return ZoneInfo(cadence.tz if isinstance(cadence, Cron) else "UTC")


def _local(ms: int, zone: ZoneInfo) -> datetime:
    instant = utc_datetime(ms)
    try:
        return instant.astimezone(zone)
    except OverflowError:  # the last hours of 9999 in a zone ahead of UTC: shown in UTC
        return instant


def absolute(ms: int, zone: ZoneInfo) -> str:
    """Return `ms` as wall-clock time in `zone`, e.g. `2026-03-29 03:00:00 CEST`."""
    return _local(ms, zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def iso(ms: int | None, zone: ZoneInfo) -> str | None:
    """Return `ms` as ISO 8601 in `zone` with its UTC offset, to the millisecond (None for
    None and for a time past year 9999, which no run has)."""
    if ms is None or ms > LATEST_MS:
        return None
    return _local(ms, zone).isoformat(timespec="milliseconds")


def utc_iso(ms: int | None) -> str:
    """Return `ms` as ISO 8601 in UTC to the millisecond, `2026-11-30T10:45:00.000Z` ('-': None)."""
    if ms is None:
        return "-"
    return _local(ms, ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def duration_text(ms: int | None) -> str:
    """Return a duration in ms in words: `250 ms`, `1.5 s`, `2 min 5 s`, `3 h 10 min` ('-')."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def relative(ms: int, now_ms: int) -> str:
    """Return `ms` relative to `now_ms` in the largest whole unit: `in 4 min`, `2 h ago`, `now`."""
    delta = ms - now_ms
    size = abs(delta)
    if size < 1000:
        return "now"
    for unit, unit_ms in _UNITS:
        if size >= unit_ms:
            count = size // unit_ms
            words = f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''}"
            return f"in {words}" if delta > 0 else f"{words} ago"
    raise AssertionError("unreachable: sizes of 1 s and more match a unit")


def cadence_json(cadence: Cadence) -> dict[str, Any]:
    """Return a cadence's typed fields: `every_ms`/`anchor` or `cron`/`tz`/`day_and`, and
    its jitter and exclusions (jitter.py, calendars.py) when it has them."""
    shaped: dict[str, Any] = {}
    if isinstance(cadence, Jittered):
        shaped["jitter_ms"], cadence = cadence.jitter_ms, cadence.inner
    if isinstance(cadence, Excluding):
        shaped["exclude"], shaped["calendars"] = list(cadence.rules), list(cadence.calendars)
        cadence = cadence.inner
    if shaped:
        return {**cadence_json(cadence), **shaped}
    if isinstance(cadence, Every):
        return {
            "kind": "every",
            "every_ms": cadence.every_ms,
            "anchor": cadence.anchor,
            "offset_ms": cadence.offset_ms,
        }
    if isinstance(cadence, At):
        return {"kind": "at", "at_ms": list(cadence.instants_ms)}
    if isinstance(cadence, Cron):
        return {"kind": "cron", "cron": cadence.expr, "tz": cadence.tz, "day_and": cadence.day_and}
    return {"kind": cadence.kind}


def computed_by(registration: Registration) -> str | None:
    """Return what computes a registration's runs outside the registry, or None
    (`Definition.computed_by`: a Celery custom schedule; its stored next run is its next
    check)."""
    return registration.definition.computed_by()


def cadence_text(registration: Registration) -> str:
    """Return a registration's cadence in words: `celery <label>` for a custom schedule."""
    words = registration.definition.describe_cadence()
    bounds = registration.definition.bounds.describe()
    return f"{words} ({bounds})" if bounds else words


def upcoming(registration: Registration, n: int) -> list[int]:
    """Return the next `n` runs (epoch ms); of a custom schedule, only its next check."""
    if computed_by(registration) is None:
        return registration.upcoming(n)
    return [] if registration.next_run_ms is None else [registration.next_run_ms]


def state(registration: Registration) -> str:
    """Return `active`, `paused`, `parked` (stopped by a dispatch that can never work, or
    by a failure streak: `pause_after_failures` parks it with its reason, and `resume --all`
    leaves it parked), `completed` (past its end, its limit or its last one-off instant; it
    never fires again), or `unscheduled` (an active one whose registry member is missing:
    nothing fires it)."""
    if registration.parked_reason is not None:
        return "parked"
    if registration.completed is not None:
        return "completed"
    if registration.paused:
        return "paused"
    return "unscheduled" if registration.unscheduled else "active"


def last_error_text(registration: Registration) -> str | None:
    """The last error as `show` and the web page give it: when the last outcome is not a
    failure (a run succeeded or was skipped since), it says the error is an earlier run's,
    an earlier attempt's of this occurrence or an earlier occurrence's."""
    error = registration.last_error
    if not error:
        return None
    if registration.last_status in ("failed", "retrying"):
        return error
    return f"{error} (from an earlier run)"


# What `show` says of an unscheduled registration (`state`), and how it comes back: a pause
# parks it at +inf (a member again), and its resume puts it at its next run.
UNSCHEDULED_TEXT = (
    "not scheduled: its registry member is missing (evicted, or deleted by hand), so nothing "
    "fires it"
)


def unscheduled_fix(registration: Registration) -> str:
    """The commands that put an unscheduled registration back at its next run (a sync that
    reads its source's schedules does too: one whose stamp holds reads none)."""
    queue, name = registration.queue, registration.name
    pause = shlex.join(["emq-bridge", "pause", queue, name])
    resume = shlex.join(["emq-bridge", "resume", queue, name])
    also = " (or a full sync of its source)" if registration.source else ""
    return f"put it back: {pause}, then {resume}{also}"


COMPLETED_WORDS = {
    "end_at": "past its end_at",
    "limit": "its limit of runs is reached",
    "at": "its last at instant has passed",
}


def completed_text(registration: Registration) -> str:
    """Return why a completed registration is, as `list` and `show` say it."""
    why = COMPLETED_WORDS.get(registration.completed or "", registration.completed or "")
    return f"completed: {why}"


def state_text(registration: Registration, width: int = 72) -> str:
    """Return the state as `list` shows it: a parked one with its reason, cut to `width`."""
    reason = registration.parked_reason
    if reason is None:
        if registration.completed is not None:
            return completed_text(registration)
        return state(registration)
    text = f"parked: {reason}"
    return text if len(text) <= width else text[: width - 3] + "..."


def status_text(registration: Registration) -> str:
    """Return the last status workers reported (`list`'s LAST STATUS), or `-` if none yet.

    A failure streak longer than one shows its length: `failed (3 in a row)`.
    """
    status = registration.last_status
    if status is None:
        return "-"
    if status == "failed" and registration.failures > 1:
        return f"failed ({registration.failures} in a row)"
    return status


def inflight_json(member: str | None) -> dict[str, Any] | None:
    """Return a record's `inflight` member as `{"member", "due_ms", "triggered"}` (or None)."""
    if member is None:
        return None
    try:
        lease = parse_lease_member(member)
    except ValueError:  # edited by hand: show it as stored
        return {"member": member, "due_ms": None, "triggered": False}
    return {"member": member, "due_ms": lease.due_ms, "triggered": lease.triggered}


def history_row(entry: HistoryEntry) -> list[str]:
    """Return a history entry as `history`'s table row."""
    marks = (
        ("redelivered", entry.redelivered),
        ("triggered", entry.triggered),
        ("backfill", entry.backfill),
    )
    flags = [f for f, on in marks if on]
    return [
        utc_iso(entry.due_ms),
        entry.status,
        str(entry.attempt),
        utc_iso(entry.started_ms),
        duration_text(entry.duration_ms),
        ",".join(flags) or "-",
        entry.error or "",
    ]


def registration_json(
    registration: Registration, now_ms: int, *, unserved: bool = False
) -> dict[str, Any]:
    """Return everything known about a registration as JSON-ready data (times in epoch ms).

    `unserved`: its next run passed and no live pump serves its queue (`health.unserved`).
    """
    cadence = registration.definition.cadence
    zone = zone_of(cadence)
    next_ms = registration.next_run_ms
    return {
        "queue": registration.queue,
        "name": registration.name,
        "state": state(registration),
        "unserved": unserved,
        "unscheduled": registration.unscheduled,
        "parked_reason": registration.parked_reason,
        "parked_ms": registration.parked_ms,
        "cadence": cadence_text(registration),
        **(cadence_json(cadence) if computed_by(registration) is None else {"kind": "computed"}),
        "misfire": registration.definition.misfire,
        # What it means: `coalesce` (the default) is `latest`, `catchup` is `all`, so that a
        # script selecting by policy finds the schedules left at the default too.
        "misfire_policy": misfire_policy(registration.definition.misfire),
        "catchup_window_ms": registration.definition.catchup_window_ms,
        "catchup_max": registration.definition.catchup_max,
        "paused_note": registration.paused_note,
        "paused_by": registration.paused_by,
        "paused_ms": registration.paused_ms,
        "overlap": registration.definition.overlap,
        "pause_after_failures": registration.definition.pause_after_failures,
        "template": StoredOrder(registration.definition.template),
        "labels": dict(registration.definition.labels),
        "source": registration.source,
        "next_run_ms": next_ms,
        "next_run": iso(next_ms, zone),
        "next_run_in_ms": None if next_ms is None else next_ms - now_ms,
        "last_due_ms": registration.last_due_ms,
        "last_fired_ms": registration.last_fired_ms,
        "last_run": iso(registration.last_fired_ms, zone),
        "fired": registration.fired,
        "missed": registration.missed,
        "last_status": registration.last_status,
        "last_error": registration.last_error,
        "last_started_ms": registration.last_started_ms,
        "last_finished_ms": registration.last_finished_ms,
        "last_duration_ms": registration.last_duration_ms,
        "last_success_ms": registration.last_success_ms,
        "failures": registration.failures,
        "skipped": registration.skipped,
        "lost": registration.lost,
        "backfill_dropped": registration.backfill_dropped,
        "inflight": inflight_json(registration.inflight),
        "buffered_due_ms": registration.buffered_due_ms,
        "completed": registration.completed,
        "completed_ms": registration.completed_ms,
        "start_ms": registration.definition.bounds.start_ms,
        "end_ms": registration.definition.bounds.end_ms,
        "limit": registration.definition.bounds.limit,
        "remaining": registration.remaining,
        "immediately": registration.definition.bounds.immediately,
        "created_ms": registration.created_ms,
        "updated_ms": registration.updated_ms,
        "now_ms": now_ms,
    }


def next_run_text(registration: Registration, now_ms: int) -> str:
    """Return the next run as `<absolute in the schedule's zone> (<relative>)`.

    A custom schedule's is its next check, and says so: `(in 3 h, next check)`.
    """
    if registration.completed is not None:
        return "- (completed)"
    if registration.paused:  # its parked next run is not a run: nothing fires until resumed
        return "- (paused)"
    if registration.no_run_left:  # past 9999, or every run excluded
        return "- (never)"
    if registration.next_run_ms is None:
        return "- (not scheduled)" if registration.unscheduled else "-"
    zone = zone_of(registration.definition.cadence)
    when = relative(registration.next_run_ms, now_ms)
    if computed_by(registration) is not None:
        when += ", next check"
    return f"{absolute(registration.next_run_ms, zone)} ({when})"


def last_run_text(registration: Registration, now_ms: int) -> str:
    """Return when the last occurrence was released, relative to now, or `never`."""
    if registration.last_fired_ms is None:
        return "never"
    return relative(registration.last_fired_ms, now_ms)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return rows as left-aligned columns under an upper-case header (control characters
    escaped: `shown.printable`)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [[h.upper() for h in header], *rows]
    ]
    return "\n".join(lines)


def table_lines(
    header: Sequence[str], rows: Iterable[Sequence[str]], chunk: int = 1000
) -> Iterator[str]:
    """`table`, a line at a time from rows read `chunk` at a time, so a long listing starts
    at once and holds one chunk in memory: each chunk is aligned on the widths seen so far
    (a later, wider value widens its column from there on). Nothing when there is no row."""
    widths = [len(h) for h in header]
    first = True
    rows = iter(rows)
    while batch := list(itertools.islice(rows, chunk)):
        cells = [[printable(cell) for cell in row] for row in batch]
        for row in cells:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        if first:
            cells.insert(0, [h.upper() for h in header])
            first = False
        for row in cells:
            yield "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def to_json(data: Any) -> str:
    """Return `data` as indented JSON, the keys of its objects sorted, but for a
    `StoredOrder` (a template), printed in its stored order."""
    return json.dumps(_keys_sorted(data), indent=2, ensure_ascii=False)


def _keys_sorted(value: Any) -> Any:
    """`value` with the keys of every dict in it sorted, a `StoredOrder` kept as it is."""
    if isinstance(value, StoredOrder):
        return value
    if isinstance(value, dict):
        return {key: _keys_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_keys_sorted(item) for item in value]
    return value
