"""Backfill: send the past slots of a registration, with the ids the live schedule gives them.

`Repeat.backfill(queue, name, start, end)` (a base class of `Repeat`, as `lifecycle.py` is)
walks the nominal slots of the registration's cadence in `[start, end]` (its calendars
apply; jitter does not: a slot's id and nominal time are what matter) and hands them to
`backfill.lua`, which decides atomically, per slot, from what the registry holds:

* a slot the schedule cannot have, by the bounds of its record as the script reads them
  (before `start_at`, after `end_at`, not one of a one-off's `at` instants), is not sent
  (`outside`); a registration with a `limit` is not backfilled at all (its runs are
  counted: a backfill would add runs it cannot have);
* a slot at or after the live frontier (the slot the registration's score stands for) is
  the live schedule's to fire, and is not sent (`ahead`);
* a slot the live schedule fired (the record's runs of fired slots, kept by `claim.lua`) is
  not sent again (`live`); neither is one an earlier backfill queued (`done`);
* every other slot (before the registration existed, dropped by a misfire policy, skipped
  while paused) is queued for the pumps as a pending lease scored by its send time, spaced
  `1 / rate` seconds apart, and sent by whichever pump claims it: the occurrence id of the
  live slot, `backfill=True` on the occurrence (Celery header and Dramatiq option
  `emq_backfill`), redelivered after a crash like any lease.

The slots queued follow the registration's later changes until they are sent (`claim.lua`
decides it as it serves each): one the schedule can no longer have (before a `start_at` moved
later, after an `end_at` moved earlier, not one of a one-off's `at`, any once it has a `limit`
or its slots are placed otherwise: another `every`, cron, zone, offset or exclusions) is
dropped, unsent, and taken off the ledger, so a later backfill may queue it again; while it is
paused they are held, and a resume sends them.

A backfill needs running pumps to send what it queued; it never fires a slot twice, whatever
backfills and live firing overlap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from .bounds import Instant, epoch_ms
from .cadence import LATEST_MS, Cadence, Every, now_arg
from .definition import Definition
from .errors import CorruptRecord, RegistryError, ScheduleError, UnknownRegistration
from .jitter import Jittered, base_cadence, nominal_slot
from .keys import QueueKeys, validate_name
from .replies import record_text, redis_errors, text

if TYPE_CHECKING:
    from .scripts import Scripts

__all__ = [
    "DEFAULT_RATE",
    "MAX_BACKFILL_SLOTS",
    "MAX_SPACING_MS",
    "MIN_RATE",
    "Backfill",
    "BackfillMoves",
    "backfill_slots",
    "check_rate",
]

# Occurrences per second a backfill queues by default: a month of a 1-minute schedule
# (43,200 slots) goes out in 72 minutes instead of at once.
DEFAULT_RATE = 10.0
# The longest wait between two slots queued: a day. A slower rate is a typo (and 1 / rate
# of a tiny one overflows the send times).
MAX_SPACING_MS = 86_400_000
# The slowest rate (occurrences a second) other than 0: one slot a day.
MIN_RATE = 1000 / MAX_SPACING_MS
MAX_RATE = 1_000_000.0
# Slots per backfill: a larger range is several backfills (each queued slot is a lease).
MAX_BACKFILL_SLOTS = 100_000
# Slots per backfill.lua call: one call holds the server for a few milliseconds at most.
CHUNK = 1000
_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Backfill:
    """What a backfill did (or, dry, would do): the slots queued and those skipped."""

    queue: str
    name: str
    queued: list[int]
    live: int  # fired by the live schedule already
    done: int  # queued by an earlier backfill
    ahead: int  # at or after the live frontier: the live schedule fires them
    first_send_ms: int
    spacing_ms: int
    dry_run: bool
    outside: int = 0  # outside the bounds (start_at, end_at, at): the schedule has no such slot

    @property
    def skipped(self) -> int:
        return self.live + self.done + self.ahead + self.outside


def check_rate(rate: object) -> float:
    """Return `rate` (occurrences a second) if usable: 0 (no spacing), or from `MIN_RATE`
    (one a day) to 1,000,000; else raise `ScheduleError`."""
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not (rate == 0 or MIN_RATE <= rate <= MAX_RATE)
    ):
        raise ScheduleError(
            "rate must be 0 (no spacing), or from 1/86400 (one a day) to 1000000 "
            f"occurrences a second, got {rate!r}"
        )
    return float(rate)


def backfill_slots(
    cadence: Cadence, start_ms: int, end_ms: int, phase_ms: int | None = None
) -> list[int]:
    """Return the nominal slots of `cadence` in `[start_ms, end_ms]`, oldest first.

    An interval on `anchor="schedule"` has its slots on its own phase, not the epoch's: the
    slots `phase_ms + k * every` (`phase_ms` one of them, its next run or last fired slot).
    Raises `ScheduleError` past `MAX_BACKFILL_SLOTS`, and for an interval whose slots no
    phase places (`anchor="release"`, or `"schedule"` with no `phase_ms`).
    """
    if isinstance(cadence, Jittered):
        cadence = cadence.inner
    base = base_cadence(cadence)
    if isinstance(base, Every) and base.anchor != "grid":
        if base.anchor == "release":
            raise ScheduleError(_NO_SLOTS["release"])
        if base is not cadence:  # under exclusions
            raise ScheduleError(_NO_SLOTS["schedule"])
        if phase_ms is None:
            raise ScheduleError(_NO_SLOTS["unrun"])
        cadence = Every(base.every_ms, "grid", phase_ms % base.every_ms)
    slots: list[int] = []
    at = cadence.next_after(start_ms - 1)
    while at <= end_ms:
        if len(slots) >= MAX_BACKFILL_SLOTS:
            raise ScheduleError(
                f"the range holds more than {MAX_BACKFILL_SLOTS} slots; backfill it in parts"
            )
        slots.append(at)
        at = cadence.next_after(at)
    return slots


# Why an interval not on the epoch's grid has no slots a backfill can place.
_NO_SLOTS = {
    "release": "it runs an interval after each release (anchor='release'): it has no slots "
    "of its own to backfill",
    "schedule": "its exclusions on an interval of its own phase (anchor='schedule') leave no "
    "slots a backfill can place; move it onto the grid (anchor='grid')",
    "unrun": "it has no run yet to take its phase from (anchor='schedule'): nothing to backfill",
}


class BackfillMoves:
    """The backfill move of `Repeat` (see the module docstring)."""

    client: Any
    prefix: str
    scripts: Scripts

    def keys(self, queue: str) -> QueueKeys:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def server_time_ms(self) -> int:  # pragma: no cover - Repeat's
        raise NotImplementedError

    # Repeat's: decodes the whole record, raising `CorruptRecord` (its result, a
    # `Registration`, is not needed here: typed `object`, so this module imports no registry).
    def read(self, queue: str, name: str) -> object:  # pragma: no cover
        raise NotImplementedError

    def backfill(
        self,
        queue: str,
        name: str,
        start: Instant | int,
        end: Instant | int,
        *,
        rate: float = DEFAULT_RATE,
        dry_run: bool = False,
        now_ms: int | None = None,
    ) -> Backfill:
        """Queue every slot of `name` in `[start, end]` the live schedule did not send.

        `start`/`end` are aware datetimes, ISO 8601 strings with an offset, or epoch ms;
        `end` must not be in the future. `rate` is occurrences per second (0: no spacing).
        `dry_run` decides and writes nothing. Slots outside the registration's bounds
        (`start_at`, `end_at`, a one-off's `at`) are never sent (`outside`).
        `UnknownRegistration` (a `KeyError`) if there is no such registration;
        `CorruptRecord` if its record cannot be read (nothing is written then);
        `ScheduleError` on a bad range or rate, a registration with a `limit`, or a cadence
        decided at each check (Celery `is_due`).
        """
        keys = self.keys(queue)
        validate_name(name, "registration name")
        start_ms, end_ms = _instant_ms(start, "start", ceil=True), _instant_ms(end, "end")
        rate = check_rate(rate)
        given = now_arg(now_ms)
        now = self.server_time_ms() if given is None else given
        if end_ms < start_ms:
            raise ScheduleError("the backfill range ends before it starts")
        if end_ms > now:
            raise ScheduleError("a backfill covers the past: its end is in the future")
        spacing = min(round(1000 / rate), MAX_SPACING_MS) if rate else 0
        # The whole record is decoded first, as `trigger` does: one no reader can decode (a
        # run-state field that is not a number, too) is refused, and no slot of it queued.
        self.read(queue, name)
        for _ in range(_ATTEMPTS):
            with redis_errors(f"backfill {queue}/{name}"):
                pipe = self.client.pipeline(transaction=False)
                pipe.hgetall(keys.record(name))
                pipe.zscore(keys.registry, name)
                raw, score = pipe.execute()
            fields = record_text(raw)
            if not fields:
                raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
            try:
                definition = Definition.from_fields(fields)
            except ScheduleError as exc:
                raise CorruptRecord(
                    f"registration {queue}/{name} is corrupt: {exc} (remove it, then add it "
                    "again; replacing it with the same definition does not rewrite it)"
                ) from exc
            cadence = definition.cadence
            _check_limit(queue, name, fields)
            if hasattr(cadence, "check"):
                raise ScheduleError(
                    f"{queue}/{name} is decided at each check (is_due): it has no slots to backfill"
                )
            parked = fields.get("paused_next_ms", "")
            frontier = _frontier(cadence, score, parked if fields.get("paused") == "1" else "")
            phase = frontier or fields.get("last_due_ms", "")
            try:
                slots = backfill_slots(
                    cadence, start_ms, end_ms, int(phase) if phase.isdigit() else None
                )
            except ScheduleError as exc:
                raise ScheduleError(f"{queue}/{name}: {exc}") from None
            score_text = "" if score is None else _score_text(score)
            read = (score_text, parked, fields.get("cadence_digest", ""))
            result = self._queue_slots(keys, name, slots, read, frontier, now, spacing, dry_run)
            if result is not None:
                queued, live, done, ahead, outside = result
                return Backfill(
                    queue, name, queued, live, done, ahead, now, spacing, dry_run, outside
                )
        raise RegistryError(
            f"backfill {queue}/{name}: the registration changed under each of {_ATTEMPTS} "
            "attempts; try again"
        )

    def _queue_slots(
        self,
        keys: QueueKeys,
        name: str,
        slots: list[int],
        read: tuple[str, str, str],
        frontier: str,
        now: int,
        spacing: int,
        dry_run: bool,
    ) -> tuple[list[int], int, int, int, int] | None:
        """Send `slots` to backfill.lua in chunks; None when the registration changed (the
        chunks before stay queued: a retry skips them as `done`). `read` is what the slots
        and the frontier were computed from: the score, `paused_next_ms` and
        `cadence_digest` as read, which the script compares. `ScheduleError` when it has a
        `limit` now."""
        score, parked, digest = read
        queued: list[int] = []
        live = done = ahead = outside = 0
        for start in range(0, len(slots), CHUNK) or [0]:
            chunk = slots[start : start + CHUNK]
            with redis_errors(f"backfill {keys.queue}/{name}"):
                reply = self.scripts.backfill(
                    keys=[keys.registry, keys.record(name), keys.leases, keys.backfilled(name)],
                    args=[
                        name,
                        score,
                        parked,
                        frontier,
                        json.dumps([str(s) for s in chunk]),
                        now + len(queued) * spacing,
                        spacing,
                        "1" if dry_run else "",
                        keys.wake_channel,
                        digest,
                    ],
                )
            if not isinstance(reply, list):
                if int(reply) == -1:
                    raise UnknownRegistration(f"no registration {name!r} in queue {keys.queue!r}")
                if int(reply) == -3:
                    _refuse_limit(keys.queue, name)
                return None
            queued += [int(s) for s in json.loads(text(reply[1]))]
            live, done, ahead = live + int(reply[2]), done + int(reply[3]), ahead + int(reply[4])
            outside += int(reply[5])
        return queued, live, done, ahead, outside


def _check_limit(queue: str, name: str, fields: dict[str, str]) -> None:
    """Refuse to backfill a registration with a `limit` (see `_refuse_limit`)."""
    if fields.get("limit"):
        _refuse_limit(queue, name)


def _refuse_limit(queue: str, name: str) -> NoReturn:
    """A registration with a `limit` is not backfilled: its runs are counted, and slots a
    backfill adds would be runs past the ones it may have."""
    raise ScheduleError(
        f"{queue}/{name} has a limit of runs: a backfill would add runs it cannot have; "
        "remove the limit to backfill it"
    )


def _instant_ms(value: Instant | int, field: str, *, ceil: bool = False) -> int:
    """Epoch ms from epoch ms, an aware datetime or an ISO 8601 string with an offset (a
    partial ms rounded up with `ceil`, for the start of the range)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= LATEST_MS:
            raise ScheduleError(f"{field} must be epoch ms from 1970 to 9999, got {value}")
        return value
    return epoch_ms(value, field, ceil=ceil)


def _score_text(score: float) -> str:
    """The registry score as ZSCORE returns it, for backfill.lua's compare."""
    if score == float("inf"):
        return "inf"
    return str(int(score)) if float(score).is_integer() else repr(score)


def _frontier(cadence: Cadence, score: float | None, parked: str) -> str:
    """The first slot the live schedule may still fire: the nominal slot of its score, or of
    its parked next run when paused; '' when it will fire no slot of the past again."""
    if parked:
        return str(nominal_slot(cadence, int(parked))) if parked.isdigit() else ""
    if score is None or score == float("inf"):
        return ""
    return str(nominal_slot(cadence, int(score)))
