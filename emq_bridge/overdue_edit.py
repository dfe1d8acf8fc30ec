"""Where an edited definition resumes a registration whose next run is overdue.

An edit that changes a registration's cadence digest while its next run is overdue (no
pump claimed that slot), or while it is paused and its parked next run passed (its paused
window: `paused_window_slot`), is sent to `upsert.lua` twice: the script first answers digit 6,
then the caller reads the record's slot-placing fields and its score, and sends the slot
this module gives (or '' for none). When the slots are the same as before, and only what
bounds or excludes them changed (a start or an end, an exclusion), the overdue slot is
still one of the new definition's, and must not be dropped as a changed cadence's are: the
registration resumes at the first slot at or after its score that the new definition
fires. The script applies it only if the record's cadence digest and score are still those
read (compare-and-set).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .calendars import Excluding
from .definition import Definition

__all__ = ["SLOT_FIELDS", "paused_window_slot", "resumed_slot"]

# The record fields that place a cadence's slots: every cadence's `to_fields` less what
# excludes slots (`exclude`, `calendars`). Bounds are not record fields of the cadence.
SLOT_FIELDS = (
    "every_ms",
    "anchor",
    "offset_ms",
    "cron",
    "tz",
    "day_and",
    "seed",
    "at",
    "jitter_ms",
    "cadence_label",
)


def resumed_slot(
    definition: Definition, stored: Sequence[str | None], live_ms: int | None
) -> int | None:
    """Return the first slot at or after `live_ms` (the record's score, overdue) that
    `definition` fires, or None when the overdue slots are a changed cadence's to drop.

    `stored` holds the record's `SLOT_FIELDS` values, in that order (None where absent).
    None also for a jittered or Celery-decided cadence (a score that is not its slot), and
    when the new start is after the score (the new definition re-derives its first run).
    """
    if live_ms is None:
        return None
    fields = definition.cadence.to_fields()
    new: Mapping[str, str | None] = {name: fields.get(name) for name in SLOT_FIELDS}
    old = dict(zip(SLOT_FIELDS, stored, strict=True))
    if old != new or new["jitter_ms"] is not None or new["cadence_label"] is not None:
        return None
    start = definition.bounds.start_ms
    if start is not None and start > live_ms:
        return None
    cadence = definition.cadence
    if isinstance(cadence, Excluding):
        return cadence.admit(live_ms)
    return live_ms


def paused_window_slot(
    definition: Definition, parked_ms: int | None, last_due_ms: int | None
) -> int | None:
    """Return where a paused registration's window starts under its edited `definition`: the
    first slot it fires at or after `parked_ms` (the next run when it was paused, passed
    since) and after `last_due_ms` (its last fired slot); None when nothing is parked.

    A resume with catch-up hands the window from there to the misfire policy, as it would
    have without the edit (a plain resume goes on at the first future slot either way)."""
    if parked_ms is None:
        return None
    after = parked_ms - 1 if last_due_ms is None else max(parked_ms - 1, last_due_ms)
    return definition.first_run(after, created=False)
