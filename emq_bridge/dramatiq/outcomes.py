"""`MessageOutcomes`: what a Dramatiq worker tells the registry of the occurrences it runs.

Part of `emq_bridge.dramatiq`; `RecurringMiddleware` calls it from its hooks. Dramatiq
decides what becomes of a message after the actor returned: its `Retries` middleware either
enqueues the message again with a delay (a retry) or fails it (`message.fail()`, the message is
dead-lettered). Middleware `after_*` hooks run in reverse order, so ours may run before or after
`Retries`; the outcome is therefore decided when the worker thread acks or nacks the message,
after every middleware ran:

* nacked: `failed` (retries exhausted, `throws`, or failed by a middleware); a message for
  an actor this worker does not declare (Dramatiq's `ActorNotFound`: an old worker meets a
  new actor's message in a rolling deploy) is `failed` too, as one whose task never ran
  (`Report.task_ran`): it neither counts toward `pause_after_failures` nor ends a streak;
* acked after the actor raised, with a re-enqueue of the same message seen in between
  (`before_enqueue`): `retrying`, held in flight for the retry's delay;
* acked after the actor raised, with no re-enqueue (no `Retries` middleware): `failed`;
* acked otherwise: `succeeded`;
* `after_skip_message` (a middleware or the actor raised `SkipMessage`): `skipped`; one
  skipped before its start (`AgeLimit`, ahead of ours) is a copy that never ran
  (`Report.task_ran`), which leaves the same attempt running elsewhere as it is.

`started` is reported in `before_process_message`, with the attempt (`retries + 1`). Every
report goes through one `emq_bridge.reporting.Reporter` per worker process, which only queues
it: a report never slows or fails the actor, and is dropped (one log line) while Redis is down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..lifecycle import START_TIMEOUT_MS, BeginVerdict, checked_name, eta_hold_ms
from ..occurrence import is_occurrence_id
from ..outcome import Report, ReportKind, error_text
from ..reporting import Reporter
from .schedule import (
    OPTION_BACKFILL,
    OPTION_DUE_MS,
    OPTION_GUARDED,
    OPTION_NAME,
    OPTION_QUEUE,
    OPTION_REDELIVERED,
    OPTION_RELEASED_MS,
    OPTION_TRIGGERED,
    attempt_of,
)

__all__ = ["MessageOutcomes"]

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _eta_hold_ms(options: dict[str, Any], now_ms: int) -> int:
    """`eta_hold_ms` of a message waiting for its `eta` (epoch ms: a retry's backoff, in a
    consumer's delay queue; a Redis broker gives a dead worker's back minutes later); 0 for
    none."""
    eta = options.get("eta")
    return eta_hold_ms(eta, now_ms) if type(eta) is int else 0


def start_report(message: Any, at_ms: int) -> Report | None:
    """Return the `started` report, at `at_ms`, of the occurrence `message` carries (attempt
    `retries + 1`), or None for a message emq-bridge did not send. ValueError or
    `InvalidName` if its options are garbled. What `report_of` would make of them, read
    in one pass: this runs before every message a worker processes."""
    options = getattr(message, "options", None) or {}
    due_ms = options.get(OPTION_DUE_MS)
    if due_ms is None:
        return None
    released = options.get(OPTION_RELEASED_MS)
    try:
        due = int(due_ms)
        released_ms = None if released in (None, "") else int(released)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not an occurrence message: {exc}") from None
    return Report(
        "started",
        checked_name(options.get(OPTION_QUEUE) or message.queue_name, "queue"),
        checked_name(options.get(OPTION_NAME, ""), "registration name"),
        str(message.message_id),
        due,
        at_ms,
        attempt_of(options),
        released_ms,
        bool(options.get(OPTION_REDELIVERED, False)),
        bool(options.get(OPTION_TRIGGERED, False)),
        backfill=bool(options.get(OPTION_BACKFILL, False)),
    )


@dataclass(slots=True)
class _Run:
    """The message a worker thread processes, from `before_process_message` to its ack.

    `start` is its `started` report, built once from the message: the final report is made
    from it (`Report.ended`), carrying the start. `began` says whether it was sent (a run
    whose start was not seen reports no start). `clock` is the monotonic clock when the
    start was stamped: the run's end is timed from it (`now_ms`)."""

    message: Any  # the `MessageProxy` every hook of one processing is handed
    message_id: str
    start: Report
    clock: float
    finished_ms: int | None = None
    error: BaseException | None = None
    retry_delay_ms: int | None = None
    skipped: bool = False  # reported at the skip; its ack or nack reports nothing more
    began: bool = False

    def now_ms(self) -> int:
        """Now, for this run: its start plus the time elapsed on the monotonic clock, so that
        a step of the wall clock during the run (NTP) neither stretches nor zeroes its
        duration, and its end stays in line with its start (docs/lifecycle.md)."""
        return self.start.at_ms + int((time.monotonic() - self.clock) * 1000)


class MessageOutcomes:
    """Report the occurrences a worker process runs (see the module docstring).

    `reporter` is called once, on the first report, to build this process's `Reporter`.
    A message is an occurrence only when its id is the one a pump of the reporter's registry
    gives it (`is_occurrence_id`, with that registry's prefix, which `prefix` says); a
    message that only carries the options (a `message.copy(message_id=...)` fan-out, a
    message of another deployment's prefix, a forged one) is processed as a plain one,
    reported and guarded not at all, and said once a process. Every method is a hook's body
    and never raises.
    """

    def __init__(
        self, reporter: Callable[[], Reporter], prefix: Callable[[], str] | None = None
    ) -> None:
        self._make_reporter = reporter
        # The registry's prefix, read once, without building the registry (that is the
        # reporter thread's, off the actor's path): `prefix`, else the reporter's registry's.
        self._prefix_of = prefix
        self._prefix: str | None = None
        # Said once at WARNING (a worker whose prefix is not the pump's would say it of every
        # message), the others at DEBUG.
        self._foreign_said = False
        self._reporter: Reporter | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def reporter(self) -> Reporter:
        if self._reporter is None:
            with self._lock:
                if self._reporter is None:
                    self._reporter = self._make_reporter()
        return self._reporter

    # -- the hooks -------------------------------------------------------------------------

    def started(self, message: Any) -> BeginVerdict:
        """`before_process_message`: the occurrence starts (attempt `retries + 1`): `"run"`.

        For a guarded occurrence (`OPTION_GUARDED`), what `Repeat.begin_verdict` says when
        it may not run, reporting nothing: `"skip"` while another occurrence of its
        registration is in flight (`skipped` is reported when the middleware skips it);
        `"copy"` or `"running"`, a copy of an attempt that ran or runs elsewhere (nothing is
        reported for it: its `skipped` would end the first copy's entry). One round trip,
        for guarded messages only; `"run"` on any doubt."""
        self._local.run = None
        run = self._run_of(message, create=True)
        if run is None:
            return "run"
        if message.options.get(OPTION_GUARDED):
            verdict = self._begin_verdict(run)
            if verdict != "run":
                run.skipped = verdict != "skip"
                return verdict
        run.began = True
        self._queue(run.start)
        return "run"

    @property
    def lapse_ms(self) -> int:
        """How long after now a running occurrence's heartbeats would have lapsed, at most."""
        return self.reporter.heartbeat_ttl_ms

    def processed(self, message: Any, exception: BaseException | None) -> None:
        """`after_process_message`: note when the actor ended and how (decided at the ack).

        The run is heartbeated no more from here: if the broker's ack then fails (Dramatiq
        logs it, and calls neither `after_ack` nor `after_nack`), no final report comes, and
        the occurrence is lost when its last heartbeat expires instead of holding its
        schedule (`skip`) for as long as the worker lives."""
        run = self._run_of(message, create=True)
        if run is not None:
            run.finished_ms = run.now_ms()
            run.error = exception
            if run.began:
                try:
                    self.reporter.ended(run.start)
                except Exception as exc:  # a bug: never into the worker
                    log.warning("occurrence %s: its heartbeats go on: %s", run.message_id, exc)

    def enqueued(self, message: Any, delay_ms: int | None) -> None:
        """`before_enqueue`: the message in hand sent again is a retry (`Retries`)."""
        run = self._run_of(message)
        if run is not None:
            run.retry_delay_ms = delay_ms if isinstance(delay_ms, int) and delay_ms > 0 else 0

    def skipped(self, message: Any) -> None:
        """`after_skip_message`: the occurrence was skipped, before or inside the actor."""
        run = self._run_of(message, create=True)
        if run is not None and not run.skipped:
            run.skipped = True
            # Skipped before its start (a middleware ahead of ours: `AgeLimit`): this copy
            # never ran, so it does not end the attempt if it runs elsewhere (a redelivery).
            self._send("skipped", run, run.now_ms(), task_ran=run.began)

    def acked(self, message: Any) -> None:
        """`after_ack`: succeeded, or retrying/failed if the actor raised (module docstring)."""
        run = self._run_of(message)
        if run is None:  # not ours, or a delayed message moved to its queue (consumer thread)
            return
        self._local.run = None
        if run.skipped:
            return
        at_ms = run.finished_ms or run.now_ms()
        if run.error is None:
            self._send("succeeded", run, at_ms)
        elif run.retry_delay_ms is not None:
            self._send("retrying", run, at_ms, run.error, hold_ms=run.retry_delay_ms)
        else:
            self._send("failed", run, at_ms, run.error)

    def nacked(self, message: Any, actor_found: bool = True) -> None:
        """`after_nack`: the message failed for good (dead-lettered). `actor_found=False`:
        its actor is not one of this worker's broker (`ActorNotFound`), so it never ran:
        `failed`, naming the actor, with `task_ran=False`."""
        run = self._run_of(message, create=True)
        self._local.run = None
        if run is not None and not run.skipped:
            if not actor_found:
                actor = getattr(message, "actor_name", "?")
                error_line = f"ActorNotFound: {actor!r} is not an actor of this worker"
                self._send("failed", run, run.now_ms(), error_line, task_ran=False)
                return
            error: BaseException | str | None = run.error
            if error is None:
                error = "the message failed before its actor ran"
            self._send("failed", run, run.finished_ms or run.now_ms(), error)

    def watch_waiting(self, worker: Any) -> None:
        """Have this process's reporter heartbeat, at each of its heartbeats, the guarded
        occurrences `worker` holds received and not started: in its work queue, waiting for
        a worker thread, or in a consumer's delay queue, for their eta (a retry's backoff).
        Such an occurrence holds its schedule in flight; heartbeated (`waiting`), it is
        marked lost `3 * heartbeat_s` after this process dies with it, not at its start
        timeout (10 minutes: every slot between skipped), while Dramatiq hands the dead
        worker's messages on only once its broker notices (a Redis broker: a minute or
        more). A `waiting` heartbeat keeps nothing in flight once a run of its attempt began
        (report.lua): a copy the middleware sent again, or RabbitMQ handed on, while its run
        runs elsewhere does not keep that run in flight."""
        self.reporter.watch(lambda: self._waiting(worker))

    def hand_back(self) -> None:
        """This worker stops: what it holds unstarted goes back to the broker (Dramatiq
        requeues its work and delay queues), so each such occurrence stays in flight the start
        timeout from now, as a fresh send (`Reporter.hand_back`). Called as each consumer
        thread stops (its queue's last fetch is done), before the requeue."""
        if self._reporter is not None:
            self._reporter.hand_back(START_TIMEOUT_MS)

    def _waiting(self, worker: Any) -> list[Report]:
        """The `waiting` reports of the guarded messages `worker`'s queues hold (read from
        the reporter's thread: each queue's heap copied whole, as the GIL lets one copy)."""
        try:
            consumers = list(getattr(worker, "consumers", {}).values())
        except RuntimeError:  # a consumer added meanwhile: the next heartbeat reads them
            consumers = []
        queues = [getattr(worker, "work_queue", None)]
        queues += [getattr(consumer, "delay_queue", None) for consumer in consumers]
        now = _now_ms()
        runs = []
        for queue in queues:
            for item in list(getattr(queue, "queue", ())):
                message = getattr(item, "message", None)
                options = getattr(message, "options", None)
                if not isinstance(options, dict) or not options.get(OPTION_GUARDED):
                    continue
                try:
                    start = start_report(message, now)
                    if start is not None and self._sent_as(start):
                        runs.append(start.ended("waiting", now, hold_ms=_eta_hold_ms(options, now)))
                except Exception:  # a message that is not one: nothing to keep in flight
                    continue
        return runs

    def flush(self, timeout_s: float) -> bool:
        """Send what was reported so far, at most `timeout_s`; False if some still waits."""
        return True if self._reporter is None else self._reporter.flush(timeout_s)

    def close(self, timeout_s: float) -> None:
        if self._reporter is not None:
            self._reporter.close(timeout_s)

    # -- helpers ---------------------------------------------------------------------------

    def _begin_verdict(self, run: _Run) -> BeginVerdict:
        try:
            return self.reporter.begin(run.start)
        except Exception as exc:  # a bug: never into the worker, run it
            log.warning("an occurrence was run unguarded: its overlap check failed: %s", exc)
            return "run"

    def _run_of(self, message: Any, *, create: bool = False) -> _Run | None:
        """Return this thread's run of `message`; with `create`, one made from the message
        when the start was not seen (a middleware before ours skipped or failed it)."""
        run: _Run | None = getattr(self._local, "run", None)
        if run is not None and run.message is message:  # the hooks of one processing
            return run
        try:
            message_id = str(message.message_id)
            if run is not None and run.message_id == message_id:
                return run
            if not create:
                return None
            start = start_report(message, _now_ms())
            if start is None or not self._sent_as(start):
                return None
            run = _Run(message, message_id, start, time.monotonic())
        except Exception as exc:  # a message that is not one: never into the worker
            log.warning("a message's occurrence could not be read; not reported: %s", exc)
            return None
        self._local.run = run
        return run

    def _sent_as(self, start: Report) -> bool:
        """Whether the message `start` was read from is the occurrence it names, as a pump
        sent it (see the class docstring)."""
        prefix = self._prefix
        if prefix is None:
            known = self._prefix_of() if self._prefix_of else self.reporter.known_prefix()
            prefix = self._prefix = known or self.reporter.registry().prefix
        if is_occurrence_id(
            start.id, prefix, start.queue, start.name, start.due_ms, triggered=start.triggered
        ):
            return True
        said, self._foreign_said = self._foreign_said, True
        log.log(
            logging.DEBUG if said else logging.WARNING,
            "emq-bridge: message %s carries the options of an occurrence of %s/%s but not its "
            "id (a copy under a new message_id, or a registry prefix other than %r?): processed "
            "as a plain message, not reported%s",
            start.id,
            start.queue,
            start.name,
            prefix,
            "" if said else " (said once; the others at DEBUG)",
        )
        return False

    def _send(
        self,
        kind: ReportKind,
        run: _Run,
        at_ms: int,
        error: BaseException | str | None = None,
        *,
        hold_ms: int = 0,
        task_ran: bool = True,
    ) -> None:
        try:
            text = error_text(error)
            if run.began and task_ran:  # the start's report made once, carrying it if unsent
                self.reporter.finish(run.start, kind, at_ms, text, hold_ms=hold_ms)
                return
            # No start seen (or no task run): the final report alone, with no start time.
            item = replace(
                run.start, kind=kind, at_ms=at_ms, error=text, hold_ms=hold_ms, task_ran=task_ran
            )
        except Exception as exc:  # a bug: never into the actor
            log.warning("the %s report of occurrence %s was dropped: %s", kind, run.message_id, exc)
            return
        self._queue(item)

    def _queue(self, item: Report) -> None:
        try:
            self.reporter.report(item)
        except Exception as exc:  # a bug: never into the actor
            log.warning("the %s report of occurrence %s was dropped: %s", item.kind, item.id, exc)
