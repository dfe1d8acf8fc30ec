"""The registry's lifecycle moves: what workers report of occurrences, and what it keeps.

Part of `Repeat` (a base class of it, so `registry.py` stays one responsibility a module):
`report` applies a batch of `outcome.Report`s (one `report.lua` call per queue, each made
whatever another's does),
`started`/`finished` report one occurrence from what its message carries and never raise,
`history` reads a registration's last occurrences, and `mark_lost` is the pump's move for
occurrences whose worker went silent.
"""

from __future__ import annotations

import builtins
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from .arguments import whole_arg
from .errors import (
    EmqError,
    RegistryError,
    RegistryUnavailable,
    ReportBatchError,
    ReportBatchUnavailable,
)
from .events import outcome_listeners
from .keys import QueueKeys, parse_lease_member, validate_name
from .occurrence import Occurrence, occurrence_id
from .outcome import (
    HISTORY_SIZE,
    MAX_HISTORY_SIZE,
    HistoryEntry,
    Report,
    ReportKind,
    checked_name,
    error_text,
)
from .replies import redis_errors, text
from .scripts import Scripts

__all__ = [
    "GUARDED_MODES",
    "HEARTBEAT_TTL_MS",
    "MAX_RESENDS",
    "START_TIMEOUT_MS",
    "BeginVerdict",
    "LifecycleMoves",
    "checked_name",
    "eta_hold_ms",
    "report_of",
]

log = logging.getLogger("emq_bridge.registry")

# What `begin` answers a worker about to run a guarded occurrence (begin.lua's replies:
# 1 run, -1 no such registration, 0 another occurrence is in flight, -2 a copy of this one
# that ran, -3 a copy of this one that runs now).
BeginVerdict = Literal["run", "skip", "copy", "running"]
_VERDICTS: dict[int, BeginVerdict] = {1: "run", -1: "run", 0: "skip", -2: "copy", -3: "running"}

# The claim modes of registrations whose overlap policy is not `allow` (claim.lua).
GUARDED_MODES = frozenset({"skip", "buffer_one", "replace"})
# A guarded occurrence sent is in flight until a worker reports its start, at most this long.
START_TIMEOUT_MS = 600_000
# A running occurrence whose worker did not heartbeat for this long is lost.
HEARTBEAT_TTL_MS = 30_000


def eta_hold_ms(eta_ms: int, now_ms: int) -> int:
    """How long an occurrence a worker holds waiting for its eta (epoch ms: a retry's
    backoff, a countdown) stays in flight from `now_ms`: until its eta plus the start
    timeout, as a send with that countdown (its broker gives the message back if the worker
    dies); 0 for an eta past (heartbeated as any waiting copy: a `waiting` report)."""
    left_ms = eta_ms - now_ms
    return left_ms + START_TIMEOUT_MS if left_ms > 0 else 0


# A copy held while its occurrence's run was heartbeated is sent again once those heartbeats
# lapsed (a worker killed mid-run), at most this often: each is a new message to the broker,
# whose delivery count (a RabbitMQ quorum queue's `x-delivery-limit`) starts again, so a task
# that kills its worker would otherwise run again for ever. The Celery adapter counts it in
# the copy's headers (`celery.held_copies`); Dramatiq's cannot tell a lapse from a long run.
MAX_RESENDS = 3
# Runs whose start this process reported (`Repeat.started`) and that did not end yet, kept
# at most: the oldest go past it (a worker that never reports some ends).
MAX_RUN_STARTS = 10_000

# Those runs, by (queue, occurrence id, attempt): the start's time and the monotonic clock
# then, so that `Repeat.finished` times the run on a clock no step moves (`_timed_end`). Of
# the process, not of one `Repeat`: a worker may build one per message. Single dict
# operations, atomic under the GIL: no lock (none to be held across a fork).
_run_starts: dict[tuple[str, str, int], tuple[int, float]] = {}


def _nominal(entry: HistoryEntry) -> int:
    return entry.due_ms


def _batch_error(
    failed: Sequence[tuple[str, int, RegistryError]], applied: int, total: int
) -> ReportBatchError:
    """The error of a report batch whose `failed` queues' calls (queue, reports, error)
    failed; an outage only (`ReportBatchUnavailable`) when every one of them was."""
    queues = [queue for queue, _, _ in failed]
    unsent = sum(count for _, count, _ in failed)
    outage = all(isinstance(exc, RegistryUnavailable) for _, _, exc in failed)
    kind = ReportBatchUnavailable if outage else ReportBatchError
    reasons = "; ".join(str(exc) for _, _, exc in failed)  # each "report <queue>: ..."
    return kind(
        f"report: {unsent} of {total} reports not sent ({applied} applied of the others), "
        f"as these calls failed: {reasons}",
        queues=queues,
        applied=applied,
        unsent=unsent,
    )


def check_history_size(history_size: int) -> int:
    if isinstance(history_size, bool) or not 1 <= history_size <= MAX_HISTORY_SIZE:
        raise ValueError(f"history_size must be from 1 to {MAX_HISTORY_SIZE}, got {history_size!r}")
    return history_size


def report_of(
    kind: ReportKind,
    occurrence: Occurrence | Mapping[str, Any],
    *,
    attempt: int = 1,
    at_ms: int | None = None,
    error: BaseException | str | None = None,
    hold_ms: int = 0,
) -> Report:
    """Build the `Report` of `occurrence`: an `Occurrence`, or the message the list target
    pushed (`dispatch.occurrence_message`: id, queue, name, due_ms, released_ms,
    redelivered, triggered, backfill). ValueError if the message lacks them (all but the
    flags and released_ms)."""
    if isinstance(occurrence, Occurrence):
        queue, name, ident, due = (
            occurrence.queue,
            occurrence.name,
            occurrence.id,
            occurrence.due_ms,
        )
        released: Any = occurrence.released_ms
        redelivered, triggered = occurrence.redelivered, occurrence.triggered
        backfill = occurrence.backfill
    else:
        try:
            queue, name, ident = occurrence["queue"], occurrence["name"], occurrence["id"]
            due = int(occurrence["due_ms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"not an occurrence message (needs id, queue, name, due_ms): {exc}"
            ) from None
        released = occurrence.get("released_ms")
        redelivered = bool(occurrence.get("redelivered"))
        triggered = bool(occurrence.get("triggered"))
        backfill = bool(occurrence.get("backfill"))
    return Report(
        kind=kind,
        queue=checked_name(queue, "queue"),
        name=checked_name(name, "registration name"),
        id=str(ident),
        due_ms=due,
        at_ms=int(time.time() * 1000) if at_ms is None else at_ms,
        attempt=attempt,
        released_ms=None if released in (None, "") else int(released),
        redelivered=redelivered,
        triggered=triggered,
        error=error_text(error),
        hold_ms=hold_ms,
        backfill=backfill,
    )


def _note_start(item: Report) -> None:
    """Keep the start `item` for the end of its run (`_timed_end`)."""
    _run_starts[(item.queue, item.id, item.attempt)] = (item.at_ms, time.monotonic())
    while len(_run_starts) > MAX_RUN_STARTS:
        try:
            del _run_starts[next(iter(_run_starts))]
        except (StopIteration, RuntimeError, KeyError):  # another thread changed it: its turn
            break


def _timed_end(item: Report) -> Report:
    """The final `item` at its run's start plus the time elapsed on the monotonic clock,
    when this process reported that start: a step of the wall clock during the run (NTP)
    neither stretches nor zeroes its duration (docs/lifecycle.md). As it is otherwise."""
    began = _run_starts.pop((item.queue, item.id, item.attempt), None)
    if began is None:
        return item
    return replace(item, at_ms=began[0] + int((time.monotonic() - began[1]) * 1000))


class LifecycleMoves:
    """The lifecycle moves of `Repeat` (see the module docstring)."""

    client: Any
    prefix: str
    scripts: Scripts

    def keys(self, queue: str) -> QueueKeys:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def report(
        self,
        reports: Sequence[Report],
        *,
        history_size: int = HISTORY_SIZE,
        heartbeat_ttl_ms: int = HEARTBEAT_TTL_MS,
        start_timeout_ms: int = START_TIMEOUT_MS,
        told: Sequence[Report] | None = None,
    ) -> int:
        """Apply `reports` (see `lua/report.lua`), one script call per queue; return how many
        changed something (a repeated report changes nothing).

        The outcome listeners (metrics) hear of `told` (default: every report) before the
        calls, whether they go through or not: what a worker reported. A caller sending
        reports again (the `Reporter`, after an outage) passes only those it had not sent.

        A running occurrence stays in flight `heartbeat_ttl_ms` after its last report or
        heartbeat; the history keeps the last `history_size` occurrences. Every queue's call
        is made whatever another's does (a slot migrating, a master failing over, a key of
        the wrong type fail one queue's call only); when some failed, this raises, once all
        were made, a `ReportBatchError` naming those queues (`queues`), with the reports
        the others applied (`applied`) and the failed queues' reports (`unsent`): a
        `ReportBatchUnavailable` (a `RegistryUnavailable`) when every failure was an
        outage. `started`/`finished` are the forms that never raise.
        """
        check_history_size(history_size)
        if outcome_listeners:  # metrics; on the caller's thread (the Reporter's, not a task's)
            outcome_listeners.on_reports(reports if told is None else told)
        return self._apply(reports, history_size, heartbeat_ttl_ms, start_timeout_ms)[0]

    def beat(
        self,
        runs: Sequence[Report],
        *,
        history_size: int = HISTORY_SIZE,
        heartbeat_ttl_ms: int = HEARTBEAT_TTL_MS,
    ) -> builtins.list[Report]:
        """Apply the heartbeats `runs` (`heartbeat` and `waiting` reports, as `report` does,
        one script call per queue) and return those of runs a `replace` took over: their
        registration's overlap policy is `replace` and a later occurrence is in flight in
        their place, so the revoke the pump sent should have stopped them. A worker that
        missed it (one in warm shutdown reads no remote control) stops them itself. Raises
        as `report` does."""
        check_history_size(history_size)
        if outcome_listeners:
            outcome_listeners.on_reports(runs)
        replaced = self._apply(runs, history_size, heartbeat_ttl_ms, START_TIMEOUT_MS)[1]
        return [run for run in runs if run.kind == "heartbeat" and run.id in replaced]

    def _apply(
        self,
        reports: Sequence[Report],
        history_size: int,
        heartbeat_ttl_ms: int,
        start_timeout_ms: int,
    ) -> tuple[int, set[str]]:
        """`report`'s calls (its callers checked `history_size`): how many reports applied,
        and the ids of the heartbeats' runs a `replace` took over (`beat`)."""
        by_queue: dict[str, builtins.list[Report]] = {}
        for item in reports:
            by_queue.setdefault(item.queue, []).append(item)
        applied, replaced = 0, set()
        failed: builtins.list[tuple[str, int, RegistryError]] = []
        for queue, items in by_queue.items():
            try:
                count, ids = self._report_queue(
                    queue, items, history_size, heartbeat_ttl_ms, start_timeout_ms
                )
            except RegistryError as exc:  # one queue's failure must not drop the others'
                failed.append((queue, len(items), exc))
                continue
            applied += count
            replaced.update(ids)
        if failed:
            raise _batch_error(failed, applied, len(reports)) from failed[0][2]
        return applied, replaced

    def _report_queue(
        self,
        queue: str,
        items: Sequence[Report],
        history_size: int,
        heartbeat_ttl_ms: int,
        start_timeout_ms: int,
    ) -> tuple[int, builtins.list[str]]:
        """Apply the reports of one queue, one `report.lua` call; return how many applied and
        the ids of the heartbeats' runs a `replace` took over."""
        keys = self.keys(queue)
        report_keys = []
        for item in items:
            report_keys += [keys.record(item.name), keys.history(item.name)]
        with redis_errors(f"report {queue}"):
            reply = self.scripts.report(
                keys=[keys.registry, keys.leases, keys.running, *report_keys],
                args=[
                    json.dumps([item.to_json_item() for item in items]),
                    history_size,
                    heartbeat_ttl_ms,
                    start_timeout_ms,
                    keys.wake_channel,
                ],
            )
        return int(reply[0]), [text(ident) for ident in reply[1:]]

    def started(
        self, occurrence: Occurrence | Mapping[str, Any], *, attempt: int = 1, **options: Any
    ) -> bool:
        """Report that a worker started `occurrence` (an `Occurrence` or the list target's
        message); True if it was recorded. Never raises: a failure is one log line.

        `options` go to `report` (`history_size`, `heartbeat_ttl_ms`). Heartbeat a long run
        with `heartbeat` at least every `heartbeat_ttl_ms`, or it is marked lost.
        """
        return self._report_safely("started", occurrence, attempt, None, options)

    def heartbeat(self, occurrence: Occurrence | Mapping[str, Any], **options: Any) -> bool:
        """Keep a running `occurrence` in flight (see `started`). Never raises."""
        return self._report_safely("heartbeat", occurrence, 1, None, options)

    def finished(
        self,
        occurrence: Occurrence | Mapping[str, Any],
        *,
        ok: bool,
        error: BaseException | str | None = None,
        attempt: int = 1,
        **options: Any,
    ) -> bool:
        """Report that `occurrence` ended, succeeded (`ok=True`) or failed with `error`; True
        if it was recorded. Never raises: a failure is one log line. When this process
        reported its start (`started`), its end is that start plus the time elapsed on the
        monotonic clock: a wall clock stepped meanwhile does not change its duration."""
        kind: ReportKind = "succeeded" if ok else "failed"
        return self._report_safely(kind, occurrence, attempt, error, options)

    def _report_safely(
        self,
        kind: ReportKind,
        occurrence: Occurrence | Mapping[str, Any],
        attempt: int,
        error: BaseException | str | None,
        options: Mapping[str, Any],
    ) -> bool:
        try:
            item = report_of(kind, occurrence, attempt=attempt, error=error)
            if kind == "started":
                _note_start(item)
            elif kind != "heartbeat":
                item = _timed_end(item)
            return self.report([item], **options) > 0
        except Exception as exc:  # never into the task (its docstring's promise)
            log.warning("the %s report of an occurrence was dropped: %s", kind, exc)
            return False

    def begin(
        self,
        occurrence: Occurrence | Mapping[str, Any] | Report,
        *,
        heartbeat_ttl_ms: int = HEARTBEAT_TTL_MS,
        mark: bool = True,
    ) -> bool:
        """Ask before a worker runs `occurrence` of a guarded registration (`overlap` other
        than allow): True when it may run, False when the worker should not run it. What
        `begin_verdict` says, as a bool (`"run"`)."""
        verdict = self.begin_verdict(occurrence, heartbeat_ttl_ms=heartbeat_ttl_ms, mark=mark)
        return verdict == "run"

    def begin_verdict(
        self,
        occurrence: Occurrence | Mapping[str, Any] | Report,
        *,
        heartbeat_ttl_ms: int = HEARTBEAT_TTL_MS,
        mark: bool = True,
    ) -> BeginVerdict:
        """Ask before a worker runs `occurrence` of a guarded registration (`overlap` other
        than allow) whether it may: `"skip"` while another occurrence of it is in flight (the
        worker skips this one and reports it `skipped`); `"copy"` when this attempt of it
        already ended, `"running"` when it runs now, heartbeated, elsewhere (a copy the
        broker delivered twice: the worker drops it and reports nothing, the first copy's
        reports stand; for `"running"` it may instead deliver it again once the first copy's
        heartbeats would have lapsed, `3 * heartbeat_s`, when it runs if they did); `"run"`
        makes it the one in flight (with `mark`; `mark=False` only asks and writes nothing).
        See `lua/begin.lua`: it closes what the claim cannot see, a message delivered again
        after it was marked lost, a retry that waited in the queue past its hold, a message
        redelivered while it runs. One round trip. Never raises: when Redis cannot answer
        it says `"run"` (the claim's guard still holds), with one log line. A trigger is not
        guarded: `"run"` without asking. `occurrence` may also be its `started` report (a
        worker's reporter has it built already).
        """
        try:
            item = (
                occurrence if isinstance(occurrence, Report) else report_of("started", occurrence)
            )
            if item.triggered:
                return "run"
            keys = self.keys(item.queue)
            with redis_errors(f"begin {item.queue}/{item.name}"):
                answer = self.scripts.begin(
                    keys=[keys.record(item.name), keys.running, keys.history(item.name)],
                    args=[
                        f"{item.name} {item.due_ms}",
                        heartbeat_ttl_ms,
                        "0" if mark else "1",
                        item.id,
                        item.attempt,
                        item.due_ms,
                    ],
                )
            return _VERDICTS.get(int(answer), "run")
        except (EmqError, ValueError, TypeError) as exc:
            log.warning("an occurrence was run unguarded: its overlap check failed: %s", exc)
            return "run"

    def history(self, queue: str, name: str, n: int = HISTORY_SIZE) -> builtins.list[HistoryEntry]:
        """Return the last `n` occurrences of `name`, newest nominal time first (what workers
        reported and what the overlap policy and the lost check decided). An entry edited into
        garbage is left out (logged).

        The registry keeps them in the order their entries were made, which is not always
        the slots' order: a `buffer_one` slot's entry is made when it is released, after the
        slots skipped while it waited. So all it keeps (at most `history_size`) are read and
        sorted by slot, and the first `n` returned."""
        validate_name(name, "registration name")
        whole_arg(n, "n", 0)
        if n == 0:
            return []
        with redis_errors(f"history {queue}/{name}"):
            raw = self.client.lrange(self.keys(queue).history(name), 0, -1)  # capped
        entries = []
        for item in raw:
            try:
                entries.append(HistoryEntry.from_json(text(item)))
            except (ValueError, TypeError, KeyError) as exc:
                log.error("%s/%s: a history entry is unreadable, skipped: %s", queue, name, exc)
        entries.sort(key=_nominal, reverse=True)  # stable: one slot's entries keep their order
        return entries[:n]

    def mark_lost(
        self,
        queue: str,
        members: Sequence[str],
        *,
        history_size: int = HISTORY_SIZE,
        start_timeout_ms: int = START_TIMEOUT_MS,
    ) -> builtins.list[tuple[str, int, str]]:
        """Mark the occurrences in flight `members` lost if their deadline passed on the
        server's clock (see `lua/lost.lua`); return `(name, due_ms, id)` of those this call
        marked. A member that is not an occurrence's (edited by hand) is marked without a
        history entry."""
        keys = self.keys(queue)
        items, record_keys, out = [], [], []
        for member in members:
            try:
                lease = parse_lease_member(member)
                ident = occurrence_id(
                    self.prefix, queue, lease.name, lease.due_ms, triggered=lease.triggered
                )
                name, due = lease.name, lease.due_ms
            except ValueError:
                name, due, ident = member.split(" ")[0] or "?", 0, ""
            items.append([member, ident, str(due)])
            record_keys += [keys.record(name), keys.history(name)]
            out.append((name, due, ident))
        with redis_errors(f"mark lost {queue}"):
            marked = self.scripts.lost(
                keys=[keys.leases, keys.running, *record_keys],
                args=["", history_size, start_timeout_ms, keys.wake_channel, json.dumps(items)],
            )
        return [out[int(i) - 1] for i in marked]
