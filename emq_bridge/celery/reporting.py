"""Worker-side reports: what became of each task emq-bridge sent, told to the registry.

Part of `emq_bridge.celery`, connected when it is imported. The receivers are process-wide
Celery signals; they act only on tasks that carry emq-bridge's headers (`emq_due_ms` and
`emq_schedule`) and only for an app whose `emq_bridge_report` is on (the default):

* `task_prerun` (in the pool process): `started`;
* `task_postrun`: `succeeded` when the task returned (its state `SUCCESS`), `skipped` for an
  `Ignore` (but not the one `Task.replace()` raises: see `replacement`), `failed` for a
  `Reject` without requeue, and for one with a requeue nothing will do (a task not acked
  late, whose message Celery acked before it ran, or one run eagerly);
* `task_failure`: `failed`, with `"Type: message"`; also sent by the main process when a
  pool process died (`WorkerLostError`) or a task hit its hard time limit
  (`TimeLimitExceeded`, Celery 5.7), as Celery records that task's result. On `-P gevent`
  the hard time limit is a `gevent.Timeout` raised in the task, which leaves it through
  `task_postrun` with no state, then `Request.on_timeout` sends `task_failure` with no
  request pushed: the run's start is kept aside by task id between the two (`_escaped`);
* `task_retry`: `retrying`, in flight for the retry's countdown (or until its eta);
* `task_revoked` (in the main process): `revoked`;
* `task_internal_error` of an eager run (`task_always_eager` with `task_eager_propagates`,
  where the task's exception goes up to the caller with no `task_failure`): `failed` (or
  `retrying` for a `Retry`);
* `task_unknown` (in the main process: a task this worker does not know, which Celery
  rejects and records failed): `failed`, with `NotRegistered`, as an occurrence whose task
  never ran (`Report.task_ran`: an old worker meets a new task's message in a rolling
  deploy), which neither counts toward `pause_after_failures` nor ends a failure streak;
* `task_rejected` with an error (in the main process: a message Celery refused before it
  became a task, a content type not in `accept_content`, `ContentDisallowed`): the same.
  A body Celery cannot decode (`on_decode_error`: a signed message whose certificate the
  worker does not trust) sends no signal: nothing is reported, and a guarded occurrence
  holds its schedule until its start timeout.

A guarded occurrence (`emq_guarded`: overlap skip, buffer_one or replace) is checked when
the worker's main process receives it (`task_received`, before it waits for a pool
process): while another occurrence of its registration is in flight it is revoked there, as
Celery's own `revoke` does (the pool never runs it; `task_revoked` reports it `revoked`).
That closes what a revoke broadcast cannot reach: a `replace` that revoked an occurrence
while no worker was listening, a message delivered again after it was marked lost. A copy of
an occurrence whose attempt ran or runs (heartbeated) elsewhere, as the Redis transport
redelivers an unacked `acks_late` task once its visibility timeout passes, is revoked there
too and reports nothing: the first copy's reports stand. One whose occurrence runs now is held
back and sent again once that run's heartbeats would have lapsed: see `held_copies`.

`Task.replace()` of a task emq-bridge sent, whose replacement runs the occurrence: see
`replacement`.

Success is read at `task_postrun`, not `task_success`: Celery sends each signal only while
it has receivers, and postrun is needed anyway, so a task costs two signals, not three.

The attempt is `request.retries + 1`. A worker killed as a whole (SIGKILL, its host gone)
reports nothing: its occurrences are marked `lost` by the pump once they go
`3 * emq_bridge_heartbeat_s` without a heartbeat (so is a task killed by its hard time limit
on a Celery that does not send `task_failure` for it). A `Reject(requeue=True)` of a task acked
late reports nothing: the run of the requeued message does (the rejected run is heartbeated
no more, so a guarded occurrence's requeued copy, held on receipt while those heartbeats
last, runs once they lapsed).

Each process has one `emq_bridge.reporting.Reporter` per app, made on first use (in the
main process when the worker starts, so prefork children inherit it and reset it on their
first report): reports are queued and sent by its thread, so a task never waits for Redis
and never fails because of it. Pending reports are flushed on `worker_process_shutdown` and
`worker_shutdown`, at most `FLUSH_S` each. `report_to(app, repeat)` replaces it with one that
reports to `repeat` (a test's registry: tasks run under `task_always_eager` report in the
test's process).
"""

from __future__ import annotations

import builtins
import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from types import SimpleNamespace
from typing import Any, Literal

from celery import Celery, signals
from celery.exceptions import Retry
from celery.worker import state as worker_state

from ..errors import ConfigError, EmqError
from ..keys import MAX_NAME_BYTES
from ..lifecycle import (
    MAX_RESENDS,
    START_TIMEOUT_MS,
    check_history_size,
    eta_hold_ms,
    report_of,
)
from ..occurrence import is_occurrence_id, occurrence_id
from ..outcome import HISTORY_SIZE, Report, ReportKind, error_text
from ..registry import Repeat
from ..reporting import HEARTBEAT_S, Reporter
from ..shown import shown
from .declare import flag_setting, number_text, registry_prefix, registry_url, repeat_for
from .dispatch import (
    BACKFILL_HEADER,
    DUE_HEADER,
    GUARDED_HEADER,
    REDELIVERED_HEADER,
    RELEASED_HEADER,
    REPLACES_HEADER,
    SCHEDULE_HEADER,
    TRIGGERED_HEADER,
    header,
)
from .held_copies import _hold, _release_held, times_resent
from .process_state import _START, _process
from .replacement import (
    _REPLACED,
    PUBLISH_RECEIVER_UID,
    _attempt,
    _replaced,
    _replaces,
    _watch_replacements,
)
from .setting_names import setting_name, warn_unread_settings

__all__ = [
    "FLUSH_S",
    "PUBLISH_RECEIVER_UID",
    "history_size_setting",
    "occurrence_of",
    "report_to",
    "reporter_for",
    "started_report",
]

log = logging.getLogger("emq_bridge.celery")

# How long a shutting-down process waits for its pending reports to be sent.
FLUSH_S = 2.0
# Copies revoked on receipt whose ids a worker's main process keeps (`_Process.copies`).
MAX_COPIES = 10_000
# Runs a BaseException ended whose starts a process keeps for their failure (`_escaped`).
MAX_ESCAPED = 1_000
# No heartbeat setting reaches it (its deadlines would overflow).
INFINITY = float("inf")
# The reporter's client: short timeouts, since its thread is the only one that waits.
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0


def _settings(app: Celery) -> tuple[bool, int, float]:
    """Return `emq_bridge_report`, `emq_bridge_history_size`, `emq_bridge_heartbeat_s`;
    raise `ConfigError` naming the setting that is unusable."""
    conf = app.conf
    report = flag_setting(app, "emq_bridge_report", True)
    size = history_size_setting(app)
    beat = number_text(conf.get("emq_bridge_heartbeat_s"))
    beat = HEARTBEAT_S if beat is None else beat
    if isinstance(beat, bool) or not (isinstance(beat, (int, float)) and 0 < beat < INFINITY):
        raise ConfigError(
            f"{setting_name(app, 'emq_bridge_heartbeat_s')} must be a positive number of "
            f"seconds, got {shown(beat)}"
        )
    return report, size, float(beat)


def history_size_setting(app: Celery) -> int:
    """Return `emq_bridge_history_size` (default `HISTORY_SIZE`): what the workers' reports
    and the beat's own history entries (skipped, lost) keep; `ConfigError` if unusable."""
    size = number_text(app.conf.get("emq_bridge_history_size"), whole=True)
    size = HISTORY_SIZE if size is None else size
    name = setting_name(app, "emq_bridge_history_size")
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError(f"{name} must be a whole number, got {shown(size)}")
    try:
        return check_history_size(size)
    except ValueError as exc:  # its bounds
        raise ConfigError(f"{name}: {exc}") from exc


def _make_reporter(app: Celery) -> Reporter | None:
    report, size, heartbeat_s = _settings(app)
    if not report:
        return None
    registry_url(app)  # no registry named: ConfigError now, not one per batch

    def connect() -> Repeat:
        return repeat_for(
            app, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S
        )

    return Reporter(connect, history_size=size, heartbeat_s=heartbeat_s)


def reporter_for(app: Celery) -> Reporter | None:
    """Return this process's `Reporter` for `app`, made on first use; None when reports are
    off (`emq_bridge_report = False`) or cannot be made (a bad setting, no registry named:
    logged once, at ERROR)."""
    found = _process.reporters.get(id(app))
    if found is not None and found[0] is app:
        return found[1]
    with _process.lock:
        found = _process.reporters.get(id(app))
        if found is not None and found[0] is app:
            return found[1]
        reporter: Reporter | None = None
        try:
            reporter = _make_reporter(app)
        except EmqError as exc:
            log.error("emq-bridge: occurrence reports are OFF in this worker: %s", exc)
        _process.reporters[id(app)] = (app, reporter)
        return reporter


def report_to(app: Celery, repeat: Repeat) -> Reporter:
    """Make this process's reporter for `app` send to `repeat`, whatever the app's settings
    name (`emq_bridge_redis_url`, the broker) and even with `emq_bridge_report = False`;
    return it. For tests: a task run eagerly (`task_always_eager`) reports in this process,
    so its reports reach the test's registry (`emq_bridge.testing.fake_repeat()`), not the
    app's (a developer's own Redis). A reporter made for `app` before is replaced and
    stopped (what it queued is sent to its own registry first, at most `FLUSH_S`).

    Reports are sent by the reporter's thread: `flush()` the returned reporter before
    reading `repeat.history(...)`. `emq_bridge_history_size` and `emq_bridge_heartbeat_s`
    apply (`ConfigError` if unusable)."""
    _, size, heartbeat_s = _settings(app)
    reporter = Reporter(repeat, history_size=size, heartbeat_s=heartbeat_s)
    with _process.lock:
        before = _process.reporters.get(id(app))
        _process.reporters[id(app)] = (app, reporter)
    old = before[1] if before is not None and before[0] is app else None
    if old is not None:
        _process.used.discard(id(old))
        old.close(FLUSH_S)
    return reporter


# -- what a task request says of its occurrence -------------------------------------------


def occurrence_of(request: Any, app: Celery) -> dict[str, Any] | None:
    """Return the occurrence a task request serves, as `lifecycle.report_of` reads it, or
    None for a task emq-bridge did not send. ValueError if its headers are garbled."""
    # Protocol 2 makes a message's headers attributes of the request (its __dict__); an
    # eager `apply(headers=...)` keeps them in `request.headers` (`header` reads both).
    # Read the attributes at once: this runs before every task of a worker.
    fields = getattr(request, "__dict__", None)
    if fields is None or DUE_HEADER not in fields:
        get: Any = lambda name: header(request, name)  # noqa: E731 - the rare, slow path
    else:
        get = fields.get
    due = get(DUE_HEADER)
    schedule = get(SCHEDULE_HEADER)
    ident = getattr(request, "id", None)
    if due is None or schedule is None or not ident:
        return None
    if not isinstance(schedule, str):
        raise ValueError(f"its {SCHEDULE_HEADER} header is not a string: {schedule!r}")
    due_ms = int(due)
    triggered = bool(get(TRIGGERED_HEADER))
    queue, name = _split_schedule(app, schedule, str(ident), due_ms, triggered)
    if not _sent_as(app, str(ident), queue, name, due_ms, triggered, schedule):
        return None
    return {
        "id": str(ident),
        "queue": queue,
        "name": name,
        "due_ms": due_ms,
        "released_ms": get(RELEASED_HEADER),
        "redelivered": bool(get(REDELIVERED_HEADER)),
        "triggered": triggered,
        "backfill": bool(get(BACKFILL_HEADER)),
    }


# Schedule headers `"<queue>/<name>"` with one '/' already cut and checked: a worker runs
# the same few registrations over and over (bounded: emptied when it grows past this).
_CUTS: dict[str, tuple[str, str]] = {}
_MAX_CUTS = 10_000


def started_report(request: Any, app: Celery, attempt: int) -> Report | None:
    """Return the `started` report of the task `request` serves, or None for a task
    emq-bridge did not send; ValueError if its headers are garbled. What `report_of` makes of
    `occurrence_of`, read straight from the request where its registration was seen before:
    this runs before every task of a worker."""
    fields = getattr(request, "__dict__", None)
    schedule = fields.get(SCHEDULE_HEADER) if fields is not None else None
    cut = _CUTS.get(schedule) if isinstance(schedule, str) else None
    if fields is None or cut is None:  # its registration's first task here, or not ours
        occurrence = occurrence_of(request, app)
        if occurrence is None:
            return None
        item = report_of("started", occurrence, attempt=attempt)
        if isinstance(schedule, str) and schedule.count("/") == 1:
            if len(_CUTS) >= _MAX_CUTS:
                _CUTS.clear()
            _CUTS[schedule] = (item.queue, item.name)
        return item
    due, ident = fields.get(DUE_HEADER), fields.get("id")
    if due is None or not ident:
        return None
    due_ms, triggered = int(due), bool(fields.get(TRIGGERED_HEADER))
    if not _sent_as(app, str(ident), cut[0], cut[1], due_ms, triggered, str(schedule)):
        return None
    released = fields.get(RELEASED_HEADER)
    return Report(
        "started",
        cut[0],
        cut[1],
        str(ident),
        due_ms,
        _now_ms(),
        attempt,
        None if released in (None, "") else int(released),
        bool(fields.get(REDELIVERED_HEADER)),
        triggered,
        backfill=bool(fields.get(BACKFILL_HEADER)),
    )


def _reporting_prefix(app: Celery) -> str:
    """The prefix of the registry this process reports `app`'s tasks to: that of the registry
    `report_to` named (a test's), whose pumps sent what the tasks run, else the app's. Read
    without building the registry (that is the reporter thread's, off the task's path)."""
    reporter = reporter_for(app)
    known = reporter.known_prefix() if reporter is not None else None
    return known if known is not None else registry_prefix(app)


# Whether this process said at WARNING that a task carried an occurrence's headers under
# another id: once (a worker whose registry prefix is not the pump's would say it of every
# task), the others at DEBUG.
_FOREIGN_SAID = False


def _sent_as(
    app: Celery, ident: str, queue: str, name: str, due_ms: int, triggered: bool, schedule: str
) -> bool:
    """Whether the task `ident` is the occurrence its headers name, as a pump sent it (its
    id is the occurrence's: `is_occurrence_id`). One that only carries them (user code that
    passed a task's headers on to a child, a message of another deployment's prefix, a
    forged one) runs as a plain task: not reported, not guarded, said once a process."""
    global _FOREIGN_SAID
    prefix = _reporting_prefix(app)
    if is_occurrence_id(ident, prefix, queue, name, due_ms, triggered=triggered):
        return True
    said, _FOREIGN_SAID = _FOREIGN_SAID, True
    log.log(
        logging.DEBUG if said else logging.WARNING,
        "emq-bridge: task %s carries the headers of an occurrence of %s (%s) but not its id "
        "(headers passed on to another task, or a registry prefix other than %r?): run as a "
        "plain task, not reported%s",
        ident,
        schedule,
        "triggered" if triggered else f"due {due_ms}",
        prefix,
        "" if said else " (said once; the others at DEBUG)",
    )
    return False


def _split_schedule(
    app: Celery, schedule: str, ident: str, due_ms: int, triggered: bool
) -> tuple[str, str]:
    """Cut `"<queue>/<name>"`. Both may hold '/': then the cut whose occurrence id is the
    task id is the one (else the first '/'). Only cuts into two parts of a name's length are
    tried: a header of any other length is refused before any id is computed (a message
    another service made, of a megabyte of '/', would otherwise take an id per '/', each of
    the whole header: minutes of the worker's main process)."""
    first = schedule.find("/")
    if first < 0:
        raise ValueError(f"its {SCHEDULE_HEADER} header is not '<queue>/<name>': {schedule!r}")
    if len(schedule) > 2 * MAX_NAME_BYTES + 1:  # a character is at least a byte
        raise ValueError(
            f"its {SCHEDULE_HEADER} header is {len(schedule)} characters long; a queue and a "
            f"name are {MAX_NAME_BYTES} bytes at most"
        )
    if schedule.find("/", first + 1) >= 0:
        prefix = _reporting_prefix(app)
        for cut in (index for index, char in enumerate(schedule) if char == "/"):
            queue, name = schedule[:cut], schedule[cut + 1 :]
            if len(queue) > MAX_NAME_BYTES or len(name) > MAX_NAME_BYTES:
                continue
            if occurrence_id(prefix, queue, name, due_ms, triggered=triggered) == ident:
                return queue, name
    return schedule[:first], schedule[first + 1 :]


def _report(
    kind: ReportKind,
    task: Any,
    request: Any,
    *,
    error: BaseException | str | None = None,
    hold_ms: int = 0,
) -> None:
    """Queue the `kind` report of the task `request` serves, if emq-bridge sent it. Never
    raises and never waits on Redis: a report that cannot be built is one WARNING line."""
    try:
        if request is None:
            return
        if kind != "started":
            began: tuple[Reporter, Report, float] | None = getattr(request, _START, None)
            if began is not None:  # this process ran the task: its start has the fields
                text = error_text(error)
                end_ms = _end_ms(began[1], began[2])
                began[0].finish(began[1], kind, end_ms, text, hold_ms=hold_ms)
                return
        app = getattr(task, "app", None)
        if app is None:
            return
        reporter = reporter_for(app)
        if reporter is None:
            return
        attempt = _attempt(getattr(request, "retries", 0), _replaces(request))
        if kind == "started":
            start = started_report(request, app, attempt)
            if start is None:
                return
            if not _process.watching:  # this process runs our tasks: watch for `replace`
                _watch_replacements()
            clock = time.monotonic()  # beside the start's stamp: before any round trip
            _process.used.add(id(reporter))
            if not start.triggered and _guarded(request):
                # A guarded run is in flight, heartbeated, from its start on (one round trip,
                # as Dramatiq's middleware does): its start report waits aside for the linger,
                # and a worker killed in that while would hold the schedule until the start
                # timeout (10 minutes) instead of `3 * emq_bridge_heartbeat_s`.
                reporter.mark_running(start)
            reporter.report(start)
            setattr(request, _START, (reporter, start, clock))
            return
        occurrence = occurrence_of(request, app)
        if occurrence is None:
            return
        item = report_of(kind, occurrence, attempt=attempt, error=error, hold_ms=hold_ms)
        _process.used.add(id(reporter))
        reporter.report(item)
    except Exception as exc:  # a report must never fail the task
        log.warning(
            "emq-bridge: the %s report of task %s was not sent: %s",
            kind,
            getattr(request, "id", "?"),
            error_text(exc),
        )


def _guarded(request: Any) -> bool:
    """Whether the task `request` serves is a guarded occurrence (`emq_guarded`), read as
    `occurrence_of` reads headers: from the request's attributes when the message put them
    there (protocol 2, every worker's task), so a task start costs one dict lookup."""
    fields = getattr(request, "__dict__", None)
    if fields is not None and DUE_HEADER in fields:
        return bool(fields.get(GUARDED_HEADER))
    return bool(header(request, GUARDED_HEADER))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _end_ms(start: Report, clock: float) -> int:
    """The end, now, of the run `start` began when the monotonic clock read `clock`: its
    start plus the time elapsed, so that a step of the wall clock during the run (NTP)
    neither stretches nor zeroes its duration (docs/lifecycle.md)."""
    return start.at_ms + int((time.monotonic() - clock) * 1000)


def _hold_ms(reason: Any) -> int:
    """Return how long a retry waits before its next attempt (`Retry.when`: seconds or an
    eta), in ms; 0 when unknown."""
    when = getattr(reason, "when", None)
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        return max(0, round(when * 1000))
    if isinstance(when, datetime):
        eta = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        return max(0, round((eta - datetime.now(timezone.utc)).total_seconds() * 1000))
    return 0


# -- the receivers ------------------------------------------------------------------------


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Make the app's reporter in the main process, before the pool forks (a bad setting
    is logged at start, once); on a prefork pool, have it heartbeat the pool processes'
    runs too (`Reporter.watch`: a task holding the GIL starves its own process's
    heartbeats)."""
    app = getattr(sender, "app", None)
    if isinstance(app, Celery):
        warn_unread_settings(app)  # here, before the pool forks: once, not once a child
        reporter = reporter_for(app)
        if reporter is not None:
            prefork = _prefork(getattr(sender, "pool_cls", None))
            reporter.watch(
                lambda: (_pool_runs(app) if prefork else []) + _waiting_runs(app),
                replaced=partial(_terminate_replaced, sender) if prefork else None,
            )


def _prefork(pool: Any) -> bool:
    """Whether the worker's pool (`WorkController.pool_cls`, a class or its name, as
    `worker_init` finds it) runs tasks in other processes: prefork's."""
    from celery.concurrency import get_implementation
    from celery.concurrency.prefork import TaskPool

    try:
        found = get_implementation(pool) if pool is not None else None
    except Exception:  # a pool Celery does not know: not ours to heartbeat for
        return False
    return isinstance(found, type) and issubclass(found, TaskPool)


def _pool_runs(app: Celery) -> list[Report]:
    """The heartbeats of the runs of `app`'s tasks emq-bridge sent that the pool processes
    run now, as the worker's main process knows them (`worker_state.active_requests`: a
    task a pool process accepted and did not finish). Called from the reporter's thread."""
    runs = (_heartbeat_of(r, app) for r in _copied(worker_state.active_requests))
    return [run for run in runs if run is not None]


def _terminate_replaced(worker: Any, runs: list[Report]) -> None:
    """Terminate the pool's runs of `runs` (heartbeats of runs a `replace` took over, as
    `Repeat.beat` tells them), as the `revoke(id, terminate=True)` the pump sent would have:
    a worker in warm shutdown reads no remote control, so it ran on beside its replacement.
    Called from the reporter's thread; the termination runs where Celery's own revoke runs,
    on the worker's event loop, or here for a worker without one, or stopping (its loop
    ended: its main thread waits for the pool to drain). One that was revoked already is
    left to that revoke."""
    replaced = {run.id: run for run in runs}

    def terminate() -> None:
        pool = getattr(worker, "pool", None)
        for request in _copied(worker_state.active_requests):
            run = replaced.get(request.id)
            if run is None or pool is None or request.id in worker_state.revoked:
                continue
            log.warning(
                "emq-bridge: task %s (%s/%s) was replaced by a newer occurrence (overlap "
                "replace) and the revoke did not reach this worker (shutting down?): "
                "terminated",
                request.id,
                run.queue,
                run.name,
            )
            worker_state.revoked.add(request.id)  # what the revoke command does first
            request.terminate(pool, signal="SIGTERM")

    hub = getattr(worker, "hub", None)
    stopping = any(
        flag is not None and flag is not False
        for flag in (worker_state.should_stop, worker_state.should_terminate)
    )
    if hub is not None and not stopping:
        hub.call_soon(terminate)
    else:
        terminate()


def _waiting_runs(app: Celery) -> list[Report]:
    """The heartbeats of the guarded occurrences of `app` this worker received and has not
    started (`worker_state.reserved_requests`, waiting for a pool process, and
    `scheduled_requests`, for their eta), but those revoked on receipt. Such an occurrence
    holds its schedule in flight; heartbeated, it is marked lost `3 * heartbeat_s` after
    this worker dies with it, not at its start timeout (10 minutes: every slot between
    skipped). Called from the reporter's thread."""
    active = worker_state.active_requests
    runs = []
    for waiting in (worker_state.reserved_requests, worker_state.scheduled_requests):
        for request in _copied(waiting):
            if (
                request in active  # started: `_pool_runs`, or its own process's reports
                or request.id in worker_state.revoked
                or not (getattr(request, "request_dict", None) or {}).get(GUARDED_HEADER)
            ):
                continue
            run = _heartbeat_of(request, app, "waiting")
            if run is not None:
                hold_ms = _eta_hold_ms(getattr(request, "eta", None), run.at_ms)
                runs.append(run.ended("waiting", run.at_ms, hold_ms=hold_ms) if hold_ms else run)
    return runs


def _eta_hold_ms(eta: Any, now_ms: int) -> int:
    """`eta_hold_ms` of a request waiting for `eta` (an aware datetime: Celery's
    `Request.eta`); 0 for none."""
    if not isinstance(eta, datetime) or eta.tzinfo is None:
        return 0
    return eta_hold_ms(int(eta.timestamp() * 1000), now_ms)


def _copied(requests: Any) -> list[Any]:
    """A copy of one of Celery's request sets, WeakSets the main thread changes: copied
    again if it changed meanwhile; empty if it kept changing."""
    for _ in range(3):
        try:
            return list(requests)
        except RuntimeError:
            continue
    return []


def _heartbeat_of(
    request: Any, app: Celery, kind: Literal["heartbeat", "waiting"] = "heartbeat"
) -> Report | None:
    """The heartbeat (`waiting`: of a copy held unstarted) of the occurrence of `app` that
    Celery's `request` carries, or None (not one of ours, another app's, or garbled headers:
    its run reports nothing)."""
    fields = getattr(request, "request_dict", None)
    task = getattr(request, "task", None)
    if not fields or DUE_HEADER not in fields or getattr(task, "app", None) is not app:
        return None
    try:
        occurrence = occurrence_of(SimpleNamespace(**fields), app)
        if occurrence is None:
            return None
        attempt = _attempt(fields.get("retries"), fields.get(REPLACES_HEADER))
        return report_of(kind, occurrence, attempt=attempt)
    except (EmqError, ValueError, TypeError):
        return None


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """`task_received`, in the worker's main process: revoke a guarded occurrence while
    another occurrence of its registration is in flight (the module docstring). One round
    trip, for guarded occurrences only; on any doubt the task runs (the claim's guard holds)."""
    try:
        fields = getattr(request, "request_dict", None)
        if not fields or not fields.get(GUARDED_HEADER) or fields.get(TRIGGERED_HEADER):
            return
        app = getattr(getattr(request, "task", None), "app", None)
        reporter = reporter_for(app) if isinstance(app, Celery) else None
        if reporter is None:
            return
        occurrence = occurrence_of(SimpleNamespace(**fields), app)
        if occurrence is None:
            return
        attempt = _attempt(fields.get("retries"), fields.get(REPLACES_HEADER))
        item = report_of("started", occurrence, attempt=attempt)
        twin = _twin_here(request, fields, attempt, sender)
        if twin is not None:
            _discard_alone(request, twin)
            log.info(
                "emq-bridge: task %s (%s/%s) dropped on receipt: another copy of it waits in "
                "this worker, not started (the same message delivered twice)",
                request.id,
                occurrence["queue"],
                occurrence["name"],
            )
            return
        verdict = reporter.begin(item, mark=False)
        if verdict == "run":
            return
        if verdict == "running" and fields.get(REPLACES_HEADER):
            return  # `Task.replace()`'s message: the run it replaces holds the occurrence for it
        if verdict in ("copy", "running"):  # the first copy's reports stand: not this one's
            copies = _process.copies
            # Its run here, if any: Celery keeps one request per id (`worker_state.requests`),
            # which the copy takes over, then drops as it discards it (`_on_revoked`).
            copies[request.id] = worker_state.requests.get(request.id)
            if request.id not in worker_state.revoked:
                _process.revoked_here.add(request.id)
            if len(copies) > MAX_COPIES:
                _process.revoked_here.discard(oldest := next(iter(copies)))
                del copies[oldest]
            _quiet(request)
        worker_state.revoked.add(request.id)  # what the revoke command does: never run
        if verdict == "skip":
            why = "another occurrence of its schedule is in flight (overlap)"
        elif verdict == "copy":
            why = (
                "a copy of it runs or ran already (this attempt ended: delivered twice, or "
                "sent again by hand; a guarded occurrence runs once, and `emq-bridge trigger "
                "QUEUE NAME` runs the schedule now)"
            )
        else:
            why = "a copy of it runs or ran already (delivered twice)"
            resent = times_resent(getattr(request, "message", None))
            if verdict == "running" and resent >= MAX_RESENDS:
                log.warning(
                    "emq-bridge: task %s (%s/%s) dropped on receipt: a copy of it was sent "
                    "again %d times already, each time after its run was heard of no more "
                    "(a task that kills its worker?); not sent again",
                    request.id,
                    occurrence["queue"],
                    occurrence["name"],
                    resent,
                )
                return
            held_s = _hold(request, app, reporter, item) if verdict == "running" else None
            if held_s is not None:
                why += (
                    f"; its run was heartbeated moments ago (it may run still, or its process "
                    f"just died): held, and sent again in {held_s:g} s if those heartbeats have "
                    "lapsed by then"
                )
        log.info(
            "emq-bridge: task %s (%s/%s) revoked on receipt: %s",
            request.id,
            occurrence["queue"],
            occurrence["name"],
            why,
        )
    except Exception as exc:  # never into the worker: the task runs
        log.warning("emq-bridge: the overlap check of a received task failed: %s", exc)


def _twin_here(request: Any, fields: dict[str, Any], attempt: int, consumer: Any) -> Any:
    """Another message of `request`'s task id and attempt that this worker received and
    has not started (Celery's `worker_state.requests`, but not `active_requests`: waiting
    for a pool process or for its eta; or, for a rate-limited task, in `consumer`'s token
    bucket, waiting for its token), or None: the same message delivered twice into one
    worker, as the Redis transport restores an unacked message that waited in a busy
    worker's prefetch, or for a token, past its visibility timeout. Neither copy has
    started, so the registry cannot tell them apart, and a pool process cannot refuse a
    task: the first one received runs. A copy of one that runs goes to the registry's check
    (held, and sent again if that run's process dies: `held_copies`)."""
    if fields.get(REPLACES_HEADER) or request.id in worker_state.revoked:
        return None  # a replacement runs while the task it replaces ends, under its id
    other = worker_state.requests.get(request.id)
    if other is None or other is request or other in worker_state.active_requests:
        other = _waiting_for_a_token(request, consumer)
        if other is None:
            return None
    theirs = getattr(other, "request_dict", None) or {}
    try:
        same = _attempt(theirs.get("retries"), theirs.get(REPLACES_HEADER)) == attempt
    except (ValueError, TypeError):
        return None
    return other if same else None


def _waiting_for_a_token(request: Any, consumer: Any) -> Any:
    """Another request of `request`'s task id in `consumer`'s token bucket of its task (a
    rate-limited task waits there, out of Celery's request sets, until a token frees), or
    None. Each restore of its message past the visibility timeout came back as one more
    copy, each one waiting there too (a probe counted 25 runs of one occurrence)."""
    buckets = getattr(consumer, "task_buckets", None)
    bucket = buckets.get(request.name) if isinstance(buckets, dict) else None
    waiting = getattr(bucket, "contents", None)
    if not waiting:
        return None
    for item in _copied(waiting):  # a deque the timer changes, as the request sets are
        other = item[0] if isinstance(item, tuple) and item else None
        if other is not None and other is not request and getattr(other, "id", None) == request.id:
            return other
    return None


def _discard_alone(request: Any, twin: Any) -> None:
    """Have Celery discard `request` when it would hand it to a pool process (it checks then,
    not on receipt, while the pool is busy), as a revoke by its id does, without taking
    `twin`, which has the same id, with it: the id is in Celery's revoked set only during
    `request`'s own check. Its `task_revoked` reports nothing (`_on_revoked`), and Celery's
    request of the id is `twin` again after the discard dropped it."""
    check = request.revoked

    def revoked() -> bool:
        if request.id in worker_state.revoked:
            return bool(check())  # an operator's revoke came first: Celery's own way
        worker_state.revoked.add(request.id)
        _process.discarding = request.id
        try:
            return bool(check())
        finally:
            _process.discarding = None
            worker_state.revoked.discard(request.id)
            live = (
                worker_state.active_requests,
                worker_state.reserved_requests,
                worker_state.scheduled_requests,  # waiting for its eta
            )
            if any(twin in requests for requests in live):
                worker_state.requests[request.id] = twin

    request.revoked = revoked
    _quiet(request)


def _quiet(request: Any) -> None:
    """Have Celery's revoked-task path drop the copy `request` without a word under its id,
    which is its run's: no `REVOKED` stored in the result backend over the run's result
    (a `FAILURE`, or the run's own state while it goes on) and no `task-revoked` event (the
    run's, to Flower). Celery reads both off the request (`Request.store_errors`: not with
    its `_ignore_result`, unless the task stores errors even when it ignores results;
    `Request.send_event`: not without its `_eventer`)."""
    try:
        request._ignore_result = True
        request._eventer = None
    except AttributeError:  # a Request of another shape: the copy is revoked as before
        pass


def _on_unknown(
    sender: Any = None, message: Any = None, name: Any = None, id: Any = None, **_: Any
) -> None:
    """`task_unknown`, in the worker's main process: a task this worker does not know, which
    Celery rejects for good and records failed (`NotRegistered`): `failed`, so that a guarded
    schedule is not held until its start timeout; its task never ran (`task_ran=False`), so
    it is no failure toward `pause_after_failures`."""
    _report_unrun(sender, message, id, f"NotRegistered: {name!r} is not a task of this worker")


def _on_rejected(sender: Any = None, message: Any = None, exc: Any = None, **_: Any) -> None:
    """`task_rejected`, in the worker's main process: a message Celery refused before it
    became a task (`on_invalid_task`: a content type the worker does not accept,
    `ContentDisallowed`, as after a `task_serializer` changed on the beat's host before the
    workers'; a malformed message), rejected for good: `failed`, its task never ran, as
    `_on_unknown` reports, so that a guarded schedule is not held until its start timeout."""
    if exc is None:  # `on_unknown_message`: no task named, so no occurrence of ours either
        return
    headers = getattr(message, "headers", None)
    ident = headers.get("id") if isinstance(headers, dict) else None
    _report_unrun(sender, message, ident, error_text(exc))


def _report_unrun(sender: Any, message: Any, ident: Any, error: str) -> None:
    """Report `failed`, its task never run (`task_ran=False`), the occurrence of the message
    Celery's consumer `sender` refused (its headers, protocol 2's, read as a request's)."""
    try:
        headers = getattr(message, "headers", None)
        app = getattr(sender, "app", None)
        if not isinstance(headers, dict) or not isinstance(app, Celery) or not ident:
            return
        reporter = reporter_for(app)
        if reporter is None:
            return
        occurrence = occurrence_of(SimpleNamespace(**{**headers, "id": ident}), app)
        if occurrence is None:
            return
        attempt = _attempt(headers.get("retries"), headers.get(REPLACES_HEADER))
        _process.used.add(builtins.id(reporter))
        item = report_of("failed", occurrence, attempt=attempt, error=error)
        reporter.report(replace(item, task_ran=False))
    except Exception as exc:  # never into the worker
        log.warning("emq-bridge: the report of refused task %s was not sent: %s", ident, exc)


def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    task = task or sender
    _report("started", task, getattr(task, "request", None))


def _on_failure(
    sender: Any = None,
    task_id: Any = None,
    exception: BaseException | None = None,
    **_: Any,
) -> None:
    # In the main process (a pool process died, a hard time limit) Celery pushes the request
    # for its receivers; a Celery that sends no `task_failure` for a hard time limit reports
    # nothing here (the occurrence is lost once its heartbeats stop). On `-P gevent` the
    # hard time limit's comes with no request, after the run left its start (`_escaped`).
    request = getattr(sender, "request", None)
    escaped = _process.escaped
    began = escaped.pop(str(task_id), None) if escaped and task_id else None
    if began is not None and getattr(request, _START, None) is None:
        request = SimpleNamespace(id=task_id, **{_START: began})  # the run's start, kept aside
    _report("failed", sender, request, error=exception)


def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    if reason is None:
        return  # cancelled on a connection loss: the message is delivered again, same attempt
    cause = getattr(reason, "exc", None)
    error = cause if isinstance(cause, BaseException) else reason
    _report("retrying", sender, request, error=error, hold_ms=_hold_ms(reason))


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    ident = getattr(request, "id", None)
    if ident is not None and ident == _process.discarding:
        return  # a message delivered twice into this worker, dropped (`_discard_alone`)
    if _process.copies and ident in _process.copies:
        run = _process.copies[ident]
        live = worker_state.active_requests, worker_state.reserved_requests
        if run is None or any(run in requests for requests in live):
            # A copy revoked on receipt (or after): not its occurrence's revoke. Its discard
            # dropped the run of the same id from Celery's requests: put back, so that a
            # revoke (a `replace`, an operator's `terminate=True`) still finds it.
            if run is not None:
                worker_state.requests[ident] = run
            # Celery keeps a revoked id for hours: its own retry of the run (the same id,
            # the next attempt) would be discarded too, and the occurrence never end. Each
            # later message of the id is judged again on receipt (a copy is revoked again).
            if ident in _process.revoked_here:
                _process.revoked_here.discard(ident)
                worker_state.revoked.discard(ident)
            return
        del _process.copies[ident]  # the run's own revoke (it was terminated): reported
    if _process.escaped and ident:
        _process.escaped.pop(str(ident), None)  # terminated on gevent: revoked, not failed
    _report("revoked", sender, request)


def _on_postrun(
    sender: Any = None,
    task_id: Any = None,
    task: Any = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    task = task or sender
    try:
        _on_postrun_state(task, task_id, retval, state)
    finally:
        _flush_eager(task)


def _flush_eager(task: Any) -> None:
    """An occurrence run eagerly (`task_always_eager`: a test's `pump.run_once()` runs it in
    the test's thread) has its reports sent before its caller goes on, at most `FLUSH_S`: a
    guarded schedule's next `run_once()` then sees this run ended, instead of skipping its
    slot as overlapping a run whose end the reporter's thread had not sent yet. Any other
    task, eager or not (a worker's task calling `other.apply()`), never waits on Redis."""
    request = getattr(task, "request", None)
    if getattr(request, "is_eager", False) and header(request, DUE_HEADER) is not None:
        _flush_app(getattr(task, "app", None))


def _flush_app(app: Any) -> None:
    """Send what this process's reporter for `app` queued, at most `FLUSH_S`."""
    found = _process.reporters.get(id(app)) if isinstance(app, Celery) else None
    if found is not None and found[0] is app and found[1] is not None:
        found[1].flush(FLUSH_S)


def _on_postrun_state(task: Any, task_id: Any, retval: Any, state: str | None) -> None:
    if state is None:
        _escaped(task, task_id)
    elif state == "SUCCESS":
        _report("succeeded", task, getattr(task, "request", None))
    elif state == "IGNORED":
        request = getattr(task, "request", None)
        if getattr(request, _REPLACED, False):
            _replaced(request)
        else:
            _report("skipped", task, request, error=retval)
    elif state == "REJECTED":
        request = getattr(task, "request", None)
        reason = getattr(retval, "reason", None)
        error = f"Reject: {reason}" if reason else "Reject"
        if getattr(retval, "requeue", False):
            # Celery requeues the message only if it was not acked yet: a task acked late.
            if getattr(request, "is_eager", False):
                error += " (requeue ignored: the task ran eagerly, with no message)"
            elif not getattr(task, "acks_late", False):
                error += " (requeue ignored: the message was acked before the task ran)"
            else:  # requeued: the run of the requeued message reports
                _heartbeat_no_more(request)
                return
        _report("failed", task, request, error=error)


def _heartbeat_no_more(request: Any) -> None:
    """The run `request` serves ended with no report of its own (its message requeued by a
    `Reject`): heartbeated no more, so the requeued copy, checked on receipt, finds it
    running only until those heartbeats lapse (it is held until then: `_hold`), rather than
    for as long as this process lives."""
    began: tuple[Reporter, Report, float] | None = getattr(request, _START, None)
    if began is not None:
        began[0].ended(began[1])


def _escaped(task: Any, task_id: Any) -> None:
    """`task_postrun` with no state: a BaseException left the task (on `-P gevent` its hard
    time limit's `gevent.Timeout`, or its greenlet killed by a revoke's terminate). Keep the
    run's start by task id for the `task_failure` that may follow with no request
    (`Request.on_timeout`), and heartbeat it no more: should no final report come, the pump
    marks it lost instead of it staying `running` as long as this process lives."""
    try:
        began = getattr(getattr(task, "request", None), _START, None)
        if began is None or not task_id:
            return
        began[0].ended(began[1])
        escaped = _process.escaped
        escaped[str(task_id)] = began
        while len(escaped) > MAX_ESCAPED:
            del escaped[next(iter(escaped))]
    except Exception as exc:  # never into the worker
        log.warning("emq-bridge: the end of task %s was not noted: %s", task_id, exc)


def _on_internal_error(
    sender: Any = None,
    task_id: Any = None,
    request: Any = None,
    exception: BaseException | None = None,
    **_: Any,
) -> None:
    """`task_internal_error`: under `task_always_eager` with `task_eager_propagates`, what a
    task raises leaves Celery's tracer with this signal only (no `task_failure`: it goes up
    to the caller of `apply_async`), after a `task_postrun` with no state kept the run's
    start aside (`_escaped`): reported from that start as the signal Celery skipped would
    have (`failed`; `retrying` for a `Retry`, which Celery raises instead of running the next
    attempt). Eager runs only: in a worker, Celery sends `task_failure` after this signal,
    which reports the run."""
    fields = request if isinstance(request, dict) else getattr(request, "__dict__", {})
    if not fields.get("is_eager") or not task_id or not _process.escaped:
        return
    began = _process.escaped.pop(str(task_id), None)
    if began is None:
        return
    run = SimpleNamespace(id=task_id, **{_START: began})
    if isinstance(exception, Retry):
        cause = getattr(exception, "exc", None)
        error = cause if isinstance(cause, BaseException) else exception
        _report("retrying", sender, run, error=error, hold_ms=_hold_ms(exception))
    else:
        _report("failed", sender, run, error=exception)
    # An eager occurrence (its run's start was kept): after its `task_postrun`, which
    # flushed before this report.
    _flush_app(getattr(sender, "app", None))


def _on_shutdown(**_: Any) -> None:
    """Send what this process queued (at most `FLUSH_S` per reporter), then stop."""
    _release_held()
    for _app, reporter in list(_process.reporters.values()):
        if reporter is not None and id(reporter) in _process.used:
            reporter.close(FLUSH_S)


def _on_shutting_down(**_: Any) -> None:
    """`worker_shutting_down`, in the worker's main process (from its signal handler, so
    nothing here takes a lock): the guarded occurrences it holds unstarted go back to the
    broker as its connection closes (unacked), but leave Celery's request sets at once, so
    its heartbeats of them stop now. Each stays in flight for the start timeout, as a fresh
    send (`Reporter.hand_back`), for a worker that may come only once this one is replaced,
    rather than lost `3 * heartbeat_s` into a warm shutdown that waits for running tasks."""
    for _app, reporter in list(_process.reporters.values()):
        if reporter is not None:
            reporter.hand_back(START_TIMEOUT_MS, wake=False)
            _process.used.add(id(reporter))  # closed, so flushed, at `worker_shutdown`


_RECEIVERS = (
    (signals.worker_init, _on_worker_init),
    (signals.task_received, _on_received),
    (signals.task_unknown, _on_unknown),
    (signals.task_rejected, _on_rejected),
    (signals.task_prerun, _on_prerun),
    (signals.task_failure, _on_failure),
    (signals.task_internal_error, _on_internal_error),
    (signals.task_retry, _on_retry),
    (signals.task_revoked, _on_revoked),
    (signals.task_postrun, _on_postrun),
    (signals.worker_process_shutdown, _on_shutdown),
    (signals.worker_shutting_down, _on_shutting_down),
    (signals.worker_shutdown, _on_shutdown),
)
for _signal, _receiver in _RECEIVERS:
    _signal.connect(_receiver, weak=False, dispatch_uid=f"emq_bridge.celery.{_receiver.__name__}")
