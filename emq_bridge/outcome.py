"""What happened to an occurrence: the reports workers send and the history the registry keeps.

Inert values, importable without the registry: the adapters build `Report`s from what a
message carries, `report.lua` applies them, and `HistoryEntry` reads them back.

A report is keyed by the occurrence id and ranked, so applying one twice changes nothing:
within one attempt `running` < `retrying` < a final status; a later attempt outranks an
earlier one. `lost` (the pump's, not a worker's) is outranked by any report: a final status
that arrives after it (the worker was only slow to heartbeat), or the start of a
redelivery, puts the occurrence back in its real state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from .cadence import LATEST_MS
from .errors import ScheduleError
from .keys import lease_member, validate_name
from .shown import shown
from .utf8 import check_utf8, is_utf8

__all__ = [
    "BEAT_KINDS",
    "FINAL_STATUSES",
    "HISTORY_SIZE",
    "MAX_ERROR_CHARS",
    "MAX_HISTORY_SIZE",
    "STATUSES",
    "HistoryEntry",
    "Report",
    "ReportKind",
    "Status",
    "checked_name",
    "error_text",
]

# What the registry says of an occurrence. `running` until a worker reports its end;
# `retrying` between attempts; `skipped` by the overlap policy (or a worker that skipped it);
# `lost` when its worker stopped heartbeating; `revoked` when the framework revoked it.
Status = Literal["running", "succeeded", "failed", "retrying", "skipped", "lost", "revoked"]
STATUSES: tuple[Status, ...] = (
    "running",
    "succeeded",
    "failed",
    "retrying",
    "skipped",
    "lost",
    "revoked",
)
FINAL_STATUSES = frozenset({"succeeded", "failed", "skipped", "revoked"})
# What a worker reports: a status it reached, a heartbeat of a running occurrence, or one
# of an occurrence it holds received and not started (`waiting`: see `Report`).
ReportKind = Literal[
    "started", "succeeded", "failed", "retrying", "skipped", "revoked", "heartbeat", "waiting"
]
REPORT_KINDS = frozenset(
    {"started", "succeeded", "failed", "retrying", "skipped", "revoked", "heartbeat", "waiting"}
)
# The kinds that tell no status: they only keep an occurrence in flight.
BEAT_KINDS = frozenset({"heartbeat", "waiting"})

# The history keeps the last HISTORY_SIZE occurrences of a registration (newest first).
HISTORY_SIZE = 50
MAX_HISTORY_SIZE = 10_000
# An error is kept as "<Type>: <message>", cut to this many characters (bounded memory).
MAX_ERROR_CHARS = 200
# An occurrence id is a UUID (`occurrence_id`); a longer one is not one.
MAX_ID_CHARS = 200
# No framework retries a task this often; past it an attempt is garbage (and past 2**53 the
# script's numbers would round it).
MAX_ATTEMPT = 2**31 - 1


def error_text(error: BaseException | str | None) -> str:
    """Return `error` as one bounded line of valid UTF-8, `"<Type>: <message>"` ('' for
    None; a string as it is, made valid UTF-8). Never raises.

    A task's error may hold a lone surrogate (a file name read with `surrogateescape`): as
    JSON it becomes an escape Redis's Lua cannot decode, which would fail the whole batch of
    reports it travels in, so it is written as its backslash escape instead."""
    if error is None:
        return ""
    if isinstance(error, str):
        return _valid_utf8(error)
    try:
        message = " ".join(str(error).split())
    except Exception:  # an exception whose __str__ fails: its type still says what it was
        message = "(its message could not be read)"
    if message == "''" and getattr(error, "message", None) == "":
        message = ""  # Dramatiq's errors print an empty message as its repr (`Retry()`)
    line = f"{type(error).__name__}: {message}" if message else type(error).__name__
    if len(line) > MAX_ERROR_CHARS:
        line = line[: MAX_ERROR_CHARS - 1] + "…"
    return _valid_utf8(line)


def _valid_utf8(text: str) -> str:
    if text.isascii() or is_utf8(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# The kinds a report of a copy that never reached its task may have (`Report.task_ran`).
_UNRUN_KINDS = frozenset({"failed", "skipped"})


@dataclass(frozen=True, slots=True)
class Report:
    """One thing a worker tells of an occurrence, with what its message carried.

    `at_ms` is the worker's clock (a duration is measured on one host). `hold_ms`, for a
    `retrying` report, is how long the occurrence stays in flight before its next attempt
    starts (the retry's countdown); a running occurrence stays in flight as long as its worker
    heartbeats.

    A `waiting` report is the heartbeat of an occurrence a worker holds received and not
    started (in its prefetch, waiting for a free thread or for its eta): it keeps the
    occurrence in flight for the heartbeat TTL from now (`hold_ms`, when given, instead: one
    waiting for its eta, until then plus the start timeout, as a fresh send with a countdown;
    a worker that stops hands the message back to its broker, where it waits as a fresh send
    does), but only while no run of that attempt or a later one has begun. A copy of a run
    that started elsewhere so never keeps that run in flight once its own heartbeats stop.

    `task_ran=False` says the copy of the occurrence this report is about never reached its
    task. On a `failed` report: no worker of this version has it (Dramatiq's `ActorNotFound`,
    Celery's `NotRegistered`, as an old worker meets a new task's message during a rolling
    deploy). It is still `failed` (it ends in the history, and frees a guarded registration),
    but it neither counts toward `pause_after_failures` nor ends a failure streak, as `lost`,
    `skipped` and `revoked` do not. On a `skipped` report: a middleware skipped the message
    before the worker started it (Dramatiq's `AgeLimit`). Either way, a copy that never ran
    does not end the same attempt running elsewhere (a broker's redelivery of a message
    another worker still runs): report.lua leaves a `running` entry of that attempt as it is.

    Checked at construction, so that `Repeat.report` never stores what the registry cannot
    read back: times are `int` epoch ms from 1970 to the end of 9999 (`int(time.time() *
    1000)`, not a float), `attempt` an `int` from 1, `id` a non-empty string, `queue` and
    `name` valid names (`keys.validate_name`), `error` a string (kept cut to
    `MAX_ERROR_CHARS`), the flags `bool`s (`task_ran=False` on a `failed` or `skipped`
    report only).

    `backfill=True` says a backfill sent the occurrence, for a past slot (the Celery header
    and Dramatiq option `emq_backfill`, `backfill` in a list message): report.lua keeps it in
    the history, marked, but out of the live schedule's lifecycle (it is never in flight for
    the overlap policy, and moves neither the record's `last_*` fields nor its failure streak).
    A report without it is a live occurrence's (an older worker's).
    Anything else raises `ScheduleError` (`InvalidName` for a name).
    """

    kind: ReportKind
    queue: str
    name: str
    id: str
    due_ms: int
    at_ms: int
    attempt: int = 1
    released_ms: int | None = None
    redelivered: bool = False
    triggered: bool = False
    error: str = ""
    hold_ms: int = 0
    # A final report may carry its occurrence's start (`Reporter` folds a `started` report
    # into the final one when both wait in one batch: one update instead of two).
    started_ms: int | None = None
    task_ran: bool = True
    backfill: bool = False

    def __post_init__(self) -> None:
        # A worker builds two reports per task: the common one passes in a few comparisons
        # (exact ints in range, names already checked); anything else is checked field by
        # field, which raises `ScheduleError` (`InvalidName` for a name) saying what is wrong.
        due, at, attempt, ident = self.due_ms, self.at_ms, self.attempt, self.id
        released, started = self.released_ms, self.started_ms
        if not (
            type(due) is int
            and type(at) is int
            and type(attempt) is int
            and 0 <= due <= LATEST_MS
            and 0 <= at <= LATEST_MS
            and 1 <= attempt <= MAX_ATTEMPT
            and self.kind in REPORT_KINDS
            and type(ident) is str
            and 0 < len(ident) <= MAX_ID_CHARS
            and ident.isascii()
            and ident.isprintable()
            and '"' not in ident
            and "\\" not in ident
            and type(self.queue) is str
            and self.queue in _CHECKED_NAMES
            and type(self.name) is str
            and self.name in _CHECKED_NAMES
            and (released is None or (type(released) is int and 0 <= released <= LATEST_MS))
            and (started is None or (type(started) is int and 0 <= started <= LATEST_MS))
            and type(self.hold_ms) is int
            and 0 <= self.hold_ms <= LATEST_MS
            and type(self.error) is str
            and (self.error.isascii() or is_utf8(self.error))
            and type(self.redelivered) is bool
            and type(self.triggered) is bool
            and type(self.backfill) is bool
            and (self.task_ran is True or (self.task_ran is False and self.kind in _UNRUN_KINDS))
        ):
            _check_report(self)

    def ended(
        self,
        kind: ReportKind,
        at_ms: int,
        error: str = "",
        *,
        hold_ms: int = 0,
        started_ms: int | None = None,
    ) -> Report:
        """The `kind` report of the same occurrence and attempt, at `at_ms`: what an adapter
        that built this report at the start sends at the end, without reading the
        occurrence's fields again. It carries a start (`started_ms`) only when asked: that
        says a start folded in, never reported apart (the metrics count it as a start), which
        only the `Reporter` knows (`Reporter.finish`). `task_ran` is this report's."""
        return Report(
            kind,
            self.queue,
            self.name,
            self.id,
            self.due_ms,
            at_ms,
            self.attempt,
            self.released_ms,
            self.redelivered,
            self.triggered,
            error,
            hold_ms,
            started_ms,
            self.task_ran,
            self.backfill,
        )

    def folded(self, start: Report) -> Report:
        """This final report carrying `start`'s time (`started_ms`), and its released time
        when this one has none: the two in one update (`reporting.fold_starts`)."""
        released = self.released_ms if self.released_ms is not None else start.released_ms
        return Report(
            self.kind,
            self.queue,
            self.name,
            self.id,
            self.due_ms,
            self.at_ms,
            self.attempt,
            released,
            self.redelivered,
            self.triggered,
            self.error,
            self.hold_ms,
            start.at_ms,
            self.task_ran,
            self.backfill or start.backfill,
        )

    @property
    def member(self) -> str:
        """The occurrence's lease member form, `"<name> <due_ms>[ triggered]"`."""
        return lease_member(self.name, self.due_ms, self.triggered)

    def to_json_item(self) -> list[Any]:
        """The report as report.lua reads it (one array per report). A task that never ran
        adds a trailing 0 (`task_ran`), a backfilled occurrence's `task_ran` and a 1
        (`backfill`); the common report's array goes without, and report.lua reads an array
        without them as a task that ran, of a live occurrence (an older reporter's)."""
        item: list[Any] = [
            self.kind,
            self.member,
            self.id,
            str(self.due_ms),
            self.attempt,
            str(self.at_ms),
            "" if self.released_ms is None else str(self.released_ms),
            1 if self.redelivered else 0,
            1 if self.triggered else 0,
            self.error[:MAX_ERROR_CHARS],
            str(max(0, self.hold_ms)),
            "" if self.started_ms is None else str(self.started_ms),
        ]
        if self.backfill:
            item += [1 if self.task_ran else 0, 1]
        elif not self.task_ran:
            item.append(0)
        return item


# Names already checked (`Report`, `report_of`, the adapters): a worker reports the same few
# registrations over and over, so each is validated once (bounded: emptied when it grows past this).
_CHECKED_NAMES: set[str] = set()
_MAX_CHECKED_NAMES = 10_000


def checked_name(value: Any, what: str) -> str:
    """Return `value`, a queue or registration name a worker reports, once validated
    (`keys.validate_name`; raises `ScheduleError`), from a bounded cache after that."""
    if isinstance(value, str) and value in _CHECKED_NAMES:
        return value
    name = validate_name(value, what)
    if len(_CHECKED_NAMES) >= _MAX_CHECKED_NAMES:
        _CHECKED_NAMES.clear()
    _CHECKED_NAMES.add(name)
    return name


def _check_report(report: Report) -> None:
    """Raise `ScheduleError` (`InvalidName` for a name) naming the first unusable field of
    `report`; remember its names once they passed."""
    if report.kind not in REPORT_KINDS:
        raise ScheduleError(
            f"report kind must be one of {sorted(REPORT_KINDS)}, got {shown(report.kind)}"
        )
    if not isinstance(report.id, str) or not report.id:
        raise ScheduleError(f"report id must be a non-empty string, got {shown(report.id)}")
    if len(report.id) > MAX_ID_CHARS:
        raise ScheduleError(
            f"report id is {len(report.id)} characters long; the limit is {MAX_ID_CHARS}"
        )
    checked_name(report.queue, "queue")
    checked_name(report.name, "registration name")
    _check_ms(report.due_ms, "due_ms")
    _check_ms(report.at_ms, "at_ms")
    attempt = report.attempt
    if type(attempt) is not int or not 1 <= attempt <= MAX_ATTEMPT:  # not a bool either
        raise ScheduleError(
            f"report attempt must be an int from 1 to {MAX_ATTEMPT}, got {shown(attempt)}"
        )
    for optional, field in ((report.released_ms, "released_ms"), (report.started_ms, "started_ms")):
        if optional is not None:
            _check_ms(optional, field)
    _check_ms(report.hold_ms, "hold_ms", "a duration in ms")
    if not isinstance(report.error, str):
        raise ScheduleError(
            f"report error must be a string (error_text(exc)), got {type(report.error).__name__}"
        )
    # What travels in the script's JSON must be valid UTF-8 (see `error_text`).
    check_utf8(report.id, "report id")
    # The history finds an entry by the start of its JSON, `["<id>"`: an id JSON escapes
    # would never be found again, so its reports would each make an entry of their own.
    if any(char in '"\\' or not char.isprintable() for char in report.id):
        raise ScheduleError(
            f"report id must hold no quote, backslash or control character, got {shown(report.id)}"
        )
    check_utf8(report.error, "report error")
    for flag, field in (
        (report.redelivered, "redelivered"),
        (report.triggered, "triggered"),
        (report.task_ran, "task_ran"),
        (report.backfill, "backfill"),
    ):
        if not isinstance(flag, bool):
            raise ScheduleError(f"report {field} must be True or False, got {shown(flag)}")
    if not report.task_ran and report.kind not in _UNRUN_KINDS:
        raise ScheduleError(
            "report task_ran=False is for a failed or skipped report only, got a "
            f"{report.kind!r} report"
        )


def _check_ms(value: object, field: str, what: str = "epoch ms") -> None:
    if type(value) is not int:  # not a bool, nor an int subclass (its str() may be no number)
        hint = " (int(time.time() * 1000))" if isinstance(value, float) else ""
        raise ScheduleError(f"report {field} must be an int of {what}{hint}, got {shown(value)}")
    if not 0 <= value <= LATEST_MS:
        raise ScheduleError(
            f"report {field} must be {what} from 0 to {LATEST_MS} (year 9999), got {shown(value)}"
        )


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One occurrence in a registration's history, as the registry keeps it.

    Times are epoch ms: `due_ms` nominal, `released_ms` when a pump claimed it (server clock),
    `started_ms`/`finished_ms` on the worker's clock. `attempt` counts from 1. `backfill`:
    a backfill sent it, for a past slot, out of the live schedule's lifecycle (its reports
    said so; an entry written before backfills were marked reads False).
    """

    id: str
    due_ms: int
    status: Status
    attempt: int
    released_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    redelivered: bool
    triggered: bool
    error: str | None
    backfill: bool = False

    @property
    def duration_ms(self) -> int | None:
        if self.started_ms is None or self.finished_ms is None:
            return None
        return max(0, self.finished_ms - self.started_ms)

    @classmethod
    def from_json(cls, raw: str) -> HistoryEntry:
        """Read one stored entry (report.lua's array); ValueError if it is not one (an
        entry edited by hand: of other types, or nested past the parser's depth)."""
        try:
            item = json.loads(raw)
        except RecursionError:
            raise ValueError(f"not a history entry: {raw[:80]!r}") from None
        if not isinstance(item, list) or len(item) < 10:
            raise ValueError(f"not a history entry: {raw[:80]!r}")
        ident, due, released, started, finished, status, attempt, redelivered, triggered = item[:9]
        if not isinstance(ident, str) or status not in STATUSES or not isinstance(item[9], str):
            raise ValueError(f"not a history entry: {raw[:80]!r}")
        return cls(
            id=str(ident),
            due_ms=int(due),
            status=status,
            attempt=int(attempt),
            released_ms=_ms(released),
            started_ms=_ms(started),
            finished_ms=_ms(finished),
            redelivered=bool(redelivered),
            triggered=bool(triggered),
            error=str(item[9]) or None,
            backfill=len(item) > 10 and bool(item[10]),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what `emq-bridge history --json` prints)."""
        return {
            "id": self.id,
            "due_ms": self.due_ms,
            "status": self.status,
            "attempt": self.attempt,
            "released_ms": self.released_ms,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "duration_ms": self.duration_ms,
            "redelivered": self.redelivered,
            "triggered": self.triggered,
            "backfill": self.backfill,
            "error": self.error,
        }


def _ms(value: Any) -> int | None:
    return None if value in (None, "", False) else int(value)
