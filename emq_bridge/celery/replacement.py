"""`Task.replace()` of a task emq-bridge sent: the replacement runs the occurrence.

`Task.replace(sig)` sends `sig` with the task's id and raises `Ignore`. A process that runs
a task emq-bridge sent connects `before_task_publish` (`_on_before_publish`): the message the
running task sends with its own id and none of emq-bridge's headers (a retry copies them) is
the replacement, and gets the occurrence's headers and `emq_replaces` (the attempt it
replaces). The replaced run reports nothing at its `Ignore`; it is heartbeated once more and
no more, so its occurrence stays in flight for the replacement to start within
`3 * emq_bridge_heartbeat_s` (then it is lost, as a killed run is). The replacement passes the
copy check on receipt while that run is heartbeated, and reports its start and its end as the
same occurrence and attempt: its outcome is the occurrence's (`skip` holds while it runs, a
failure counts toward `pause_after_failures`). A replacement by a chain or a group gets the
task's id on its last task, sent later by another task: its run is reported `skipped`, as
before. The pipelined dispatcher does not count this receiver (`PUBLISH_RECEIVER_UID`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals
from celery._state import get_current_task

from ..outcome import Report
from ..reporting import Reporter
from .dispatch import (
    BACKFILL_HEADER,
    BEAT_HEADER,
    DUE_HEADER,
    GUARDED_HEADER,
    LAST_SUCCESS_HEADER,
    PREVIOUS_DUE_HEADER,
    REDELIVERED_HEADER,
    RELEASED_HEADER,
    REPLACES_HEADER,
    SCHEDULE_HEADER,
    TRIGGERED_HEADER,
    header,
)
from .process_state import _START, _process

__all__ = ["PUBLISH_RECEIVER_UID"]

log = logging.getLogger("emq_bridge.celery")

# The `dispatch_uid` of the `before_task_publish` receiver that gives `Task.replace()`'s
# message its occurrence's headers: `PipelinedCeleryDispatcher` does not count it as one that
# watches each publish (it acts only on a message a task sends with its own id).
PUBLISH_RECEIVER_UID = "emq_bridge.celery._on_before_publish"
# The headers a replacement takes from the task it replaces (`occurrence_headers`' keys).
_OCCURRENCE_HEADERS = (
    BEAT_HEADER,
    DUE_HEADER,
    SCHEDULE_HEADER,
    RELEASED_HEADER,
    REDELIVERED_HEADER,
    TRIGGERED_HEADER,
    BACKFILL_HEADER,
    PREVIOUS_DUE_HEADER,
    LAST_SUCCESS_HEADER,
    GUARDED_HEADER,
)
# Set on a task's request when `Task.replace()` sent its replacement (`_on_before_publish`).
_REPLACED = "_emq_bridge_replaced"


def _replaces(request: Any) -> Any:
    """Return the `emq_replaces` header of a task's request (None but on the message of a
    `Task.replace()`), read as `reporting._guarded` reads `emq_guarded`."""
    fields = getattr(request, "__dict__", None)
    if fields is not None and DUE_HEADER in fields:
        return fields.get(REPLACES_HEADER)
    return header(request, REPLACES_HEADER)


def _attempt(retries: Any, replaces: Any) -> int:
    """The attempt a task's message runs: Celery's `retries` + 1; on the message of a
    `Task.replace()` (`emq_replaces`: the attempt it replaced), that attempt, plus the
    replacement's own retries. ValueError if garbled."""
    return int(retries or 0) + (int(replaces) if replaces else 1)


def _watch_replacements() -> None:
    """Connect `_on_before_publish` in this process (once it runs a task emq-bridge sent: a
    beat, a pump or a web process publishes with no receiver of ours)."""
    signals.before_task_publish.connect(
        _on_before_publish, weak=False, dispatch_uid=PUBLISH_RECEIVER_UID
    )
    _process.watching = True


def _on_before_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """`before_task_publish`: the message a task emq-bridge sent publishes with its own task
    id, and without emq-bridge's headers, is `Task.replace()`'s (a retry's copies them): it
    gets the occurrence's headers and `emq_replaces` (the attempt it replaces), and the run is
    marked replaced (`_on_postrun` then reports nothing for it)."""
    try:
        if not isinstance(headers, dict) or DUE_HEADER in headers:
            return  # not protocol 2, a message of ours already, or a retry
        ident = headers.get("id")
        task = get_current_task() if ident else None
        request = getattr(task, "request", None)
        if request is None or getattr(request, "id", None) != ident:
            return
        if getattr(request, "is_eager", False):
            return  # an eager `replace` runs its replacement in place, publishing nothing
        found = {name: header(request, name) for name in _OCCURRENCE_HEADERS}
        if found[DUE_HEADER] is None or found[SCHEDULE_HEADER] is None:
            return  # the task is not one emq-bridge sent
        headers.update(found)
        headers[REPLACES_HEADER] = _attempt(getattr(request, "retries", 0), _replaces(request))
        setattr(request, _REPLACED, True)
    except Exception as exc:  # never into the task: its replacement goes as Celery sends it
        log.warning("emq-bridge: the replacement of a task was not marked as such: %s", exc)


def _replaced(request: Any) -> None:
    """The run `request` serves was replaced (`Task.replace()` sent its replacement, which
    reports the occurrence): it reports nothing. Heartbeated once more and no more here, it
    stays in flight for `3 * emq_bridge_heartbeat_s` from now for the replacement to start
    within (the replacement's start and heartbeats keep it in flight from then on); a
    replacement that does not start by then finds it lost, as a killed run's would."""
    try:
        began: tuple[Reporter, Report, float] | None = getattr(request, _START, None)
        if began is None:
            return
        reporter, start = began[0], began[1]
        reporter.report(
            Report(
                "heartbeat",
                start.queue,
                start.name,
                start.id,
                start.due_ms,
                start.at_ms,
                start.attempt,
                triggered=start.triggered,
            )
        )
        reporter.ended(start)
    except Exception as exc:  # never into the worker
        log.warning(
            "emq-bridge: the end of replaced task %s was not noted: %s",
            getattr(request, "id", "?"),
            exc,
        )
