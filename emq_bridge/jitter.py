"""Jitter: each occurrence sent at its nominal slot plus a deterministic offset. Pure math.

A `Jittered` cadence wraps the nominal one. The offset of the slot `n` is a hash of the
registration (`seed`, its name) and `n`, within `[0, jitter_ms]` and strictly before the
next nominal slot, so jitter never reorders, merges or skips slots. Its slots (what the
registry scores and the pump claims at) are the jittered instants; `nominal(score)` maps
one back to its nominal slot, which is what the occurrence carries (its id, `due_ms`): the
largest nominal slot at or before the score. That inverse is exact because an offset stays
below the gap to the next slot. A score that is no jittered slot (written before jitter was
set) has no nominal slot in reach and is its own; so is the `immediately` run, scored at the
registration instant (`immediate_instant`): the slot in reach before it is one from before
the registration, maybe one a registration of the same name fired (the same id again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta

from .cadence import (
    LATEST_MS,
    NEVER_MS,
    At,
    Cadence,
    Cron,
    Every,
    cadence_from_fields,
    parse_span,
)
from .calendars import Excluding, exclusion_from_fields
from .errors import ScheduleError
from .hashed import stable_hash, uses_hash
from .shown import shown

__all__ = [
    "MAX_JITTER_MS",
    "Jittered",
    "base_cadence",
    "bound_jitter",
    "immediate_at",
    "immediate_instant",
    "last_slot",
    "nominal_of",
    "nominal_slot",
    "parse_jitter",
    "pending_slot",
    "reseed",
    "shape",
    "shaped_from_fields",
]

# A day: jitter spreads load within a slot; a bound longer than that is a mistake.
MAX_JITTER_MS = 86_400_000


def parse_jitter(value: float | timedelta | str | None) -> int:
    """Return a jitter bound in ms from seconds, a `timedelta` or `"30s"`; 0 for None."""
    jitter_ms = parse_span(value, "jitter")
    if jitter_ms > MAX_JITTER_MS:
        raise ScheduleError(f"jitter must be at most 1 day, got {shown(value)}")
    return jitter_ms


@dataclass(frozen=True, slots=True)
class Jittered:
    """`inner`'s slots, each moved later by its own offset (see the module docstring)."""

    inner: Cadence
    jitter_ms: int
    seed: str
    # The registration's `end_at` (`bound_jitter`): a slot at or before it is sent at it at
    # the latest, so its jitter never carries it past the end, where it would not fire.
    # Not a record field: the definition's bounds hold it.
    end_ms: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.jitter_ms, bool) or not isinstance(self.jitter_ms, int):
            raise ScheduleError(f"jitter_ms must be an int, got {self.jitter_ms!r}")
        if not 0 < self.jitter_ms <= MAX_JITTER_MS:
            raise ScheduleError(f"jitter_ms must be 1 to {MAX_JITTER_MS}, got {self.jitter_ms}")

    @property
    def kind(self) -> str:
        return self.inner.kind

    def offset(self, nominal_ms: int) -> int:
        """The offset of the nominal slot `nominal_ms`: below the gap to the next slot."""
        room = min(self.jitter_ms, self.inner.next_after(nominal_ms) - nominal_ms - 1)
        if room <= 0:
            return 0
        return stable_hash(self.seed, f"jitter-{nominal_ms}") % (room + 1)

    def at(self, nominal_ms: int) -> int:
        """The instant the nominal slot `nominal_ms` is sent at (`NEVER_MS` past year 9999)."""
        sent = nominal_ms + self.offset(nominal_ms)
        if self.end_ms is not None and nominal_ms <= self.end_ms < sent:
            sent = self.end_ms  # still after its slot, and the largest slot up to it is it
        return sent if sent <= LATEST_MS else NEVER_MS

    def nominal(self, score_ms: int) -> int:
        """The nominal slot a score (a jittered instant) stands for."""
        return nominal_of(self.inner, score_ms, self.jitter_ms)

    def first_run(self, now_ms: int) -> int:
        # The nominal slots are those of `inner`, from its own first one.
        return self.at(self.inner.first_run(now_ms))

    def next_after(self, after_ms: int) -> int:
        # Only the last nominal slot at or before `after_ms` can be sent after it.
        last = last_slot(self.inner, after_ms, self.jitter_ms)
        if last is not None and (sent := self.at(last)) > after_ms:
            return sent
        return self.at(self.inner.next_after(after_ms))

    def to_fields(self) -> dict[str, str]:
        fields = {**self.inner.to_fields(), "jitter_ms": str(self.jitter_ms)}
        if self.seed:
            fields["seed"] = self.seed
        return fields

    def describe(self) -> str:
        return f"{self.inner.describe()}, jitter up to {_words(self.jitter_ms)}"


def bound_jitter(cadence: Cadence, end_ms: int | None) -> Cadence:
    """Return `cadence` with its jitter bounded by the registration's end `end_ms` (see
    `Jittered.end_ms`): itself when it has no jitter or is bounded so already."""
    if isinstance(cadence, Jittered) and cadence.end_ms != end_ms:
        return replace(cadence, end_ms=end_ms)
    return cadence


def pending_slot(cadence: Cadence, now_ms: int) -> tuple[int, int] | None:
    """Return the last slot of `cadence` at or before `now_ms` (within a day, the most a
    jitter reaches) and the instant `cadence` sends it at, or None.

    What an update needs when the cadence it replaces jittered: that cadence may not have
    sent this slot yet (its instant was ahead), while the new cadence's is past, so a next
    run derived from `now` alone would skip it (upsert.lua, result digit 5)."""
    inner = cadence.inner if isinstance(cadence, Jittered) else cadence
    slot = last_slot(inner, now_ms, MAX_JITTER_MS)
    if slot is None:
        return None
    return slot, cadence.at(slot) if isinstance(cadence, Jittered) else slot


def nominal_of(inner: Cadence, score_ms: int, reach_ms: int) -> int:
    """Return the largest slot of `inner` in `[score_ms - reach_ms, score_ms]`, else `score_ms`."""
    last = last_slot(inner, score_ms, reach_ms)
    return score_ms if last is None else last


def last_slot(inner: Cadence, at_ms: int, reach_ms: int) -> int | None:
    """Return the largest slot of `inner` in `[at_ms - reach_ms, at_ms]`, or None.

    The first probe covers the common case (one slot in reach); otherwise a binary search
    on the start of `next_after` finds the last one in about log2(reach) calls.
    """
    first = inner.next_after(at_ms - reach_ms - 1)
    if first > at_ms:
        return None
    if inner.next_after(first) > at_ms:
        return first
    # The smallest d with next_after(at - d) <= at: that slot is the last one.
    low, high = 1, at_ms - first + 1  # next_after(at - high) == first <= at
    while low < high:
        middle = (low + high) // 2
        if inner.next_after(at_ms - middle) <= at_ms:
            high = middle
        else:
            low = middle + 1
    return inner.next_after(at_ms - low)


def _words(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def shape(
    base: Cadence,
    *,
    tz: str = "UTC",
    exclude: tuple[str, ...] = (),
    calendars: tuple[str, ...] = (),
    jitter_ms: int = 0,
    seed: str | None = None,
) -> Cadence:
    """Return `base` less its excluded slots, then jittered: the cadence a record stores."""
    if (exclude or jitter_ms) and isinstance(base, At):
        raise ScheduleError("jitter and exclude apply to recurring schedules, not at= one-offs")
    if jitter_ms and isinstance(base, Every) and base.anchor == "release":
        raise ScheduleError("jitter needs a grid: it does not apply to anchor='release'")
    cadence: Cadence = base
    if exclude:
        cadence = Excluding(cadence, exclude, tz, calendars)
    if jitter_ms:
        cadence = Jittered(cadence, jitter_ms, seed or "")
    return cadence


def shaped_from_fields(fields: dict[str, str]) -> Cadence:
    """Rebuild a record's cadence with its exclusions and jitter; `ScheduleError` if corrupt."""
    cadence = exclusion_from_fields(cadence_from_fields(fields), fields)
    raw = fields.get("jitter_ms")
    if not raw:
        return cadence
    try:
        jitter_ms = int(raw)
    except ValueError:
        raise ScheduleError(f"jitter_ms {raw!r} is not an integer") from None
    return Jittered(cadence, jitter_ms, fields.get("seed") or "")


def reseed(cadence: Cadence, seed: str) -> Cadence:
    """Return `cadence` with `seed` (a registration name) wherever it has none yet: in a
    cron's `H` and in jitter. A cadence that uses neither is returned as it is."""
    if isinstance(cadence, Jittered):
        inner = reseed(cadence.inner, seed)
        if cadence.seed and inner is cadence.inner:
            return cadence
        return Jittered(inner, cadence.jitter_ms, cadence.seed or seed, cadence.end_ms)
    if isinstance(cadence, Excluding):
        inner = reseed(cadence.inner, seed)
        if inner is cadence.inner:
            return cadence
        return Excluding(inner, cadence.rules, cadence.tz, cadence.calendars)
    if isinstance(cadence, Cron) and cadence.seed is None and uses_hash(cadence.expr):
        return Cron(cadence.expr, cadence.tz, cadence.day_and, seed, stored=cadence.stored)
    return cadence


def nominal_slot(cadence: Cadence, score_ms: int, immediate_ms: int | None = None) -> int:
    """Return the nominal slot (epoch ms) a registry score stands for: what the occurrence
    sent at `score_ms` carries (its id, `due_ms`). `score_ms` itself unless `cadence` (a
    registration's `definition.cadence`, any kind) jitters, or the score is `immediate_ms`
    (the record's `immediate_instant`): the `immediately` run is no slot, but that instant."""
    if isinstance(cadence, Jittered) and score_ms != immediate_ms:
        return cadence.nominal(score_ms)
    return score_ms


def immediate_instant(fields: Mapping[str, str]) -> int | None:
    """Return the instant a record's `immediately` run is scored at, or None without one.

    `Bounds.first_run` of a created record: its `start_at` when later than its creation,
    else its creation (`created_ms`, the `now` its first run was derived from). Only that
    run is scored there: a claim moves the score past it, an edit derives it from the
    cadence after it (and from its slots, which an exclusion of the instant leaves)."""
    if fields.get("immediately") != "1":
        return None
    return immediate_at(_epoch_ms(fields.get("created_ms")), _epoch_ms(fields.get("start_ms")))


def immediate_at(created_ms: int | None, start_ms: int | None) -> int | None:
    """`immediate_instant` of a record created at `created_ms` (None: not known) with its
    `start_at` at `start_ms`."""
    if created_ms is None:
        return None
    return start_ms if start_ms is not None and start_ms > created_ms else created_ms


def _epoch_ms(raw: str | None) -> int | None:
    """A record's ms field as an int; None when absent or not digits (edited by hand)."""
    return int(raw) if raw and raw.isascii() and raw.isdigit() else None


def base_cadence(cadence: Cadence) -> Cadence:
    """The cadence under its jitter and exclusions (a `Cron`, an `Every`, ...)."""
    while isinstance(cadence, Jittered | Excluding):
        cadence = cadence.inner
    return cadence
