"""`CeleryDispatcher`: each occurrence becomes a real Celery task, and what a task reads of it.

The task is sent through `apply_async` (or `send_task` for a name the app does not know:
another service may define it), so Celery's routing, signals and serialisation all apply.
Its `task_id` is the occurrence id; the headers carry `celery_beat_task` (as Celery's beat
sets), `emq_due_ms` (the nominal time) and `emq_schedule` (`"<queue>/<name>"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from celery import Celery, Task

from ..dispatch import batch_failure
from ..errors import DispatchError, PermanentDispatchError, ScheduleError
from ..occurrence import Occurrence
from ..template import TaskTemplate

__all__ = [
    "BEAT_HEADER",
    "DUE_HEADER",
    "SCHEDULE_HEADER",
    "CeleryDispatcher",
    "nominal_due_ms",
    "nominal_time",
]

DUE_HEADER = "emq_due_ms"
SCHEDULE_HEADER = "emq_schedule"
BEAT_HEADER = "celery_beat_task"


class CeleryDispatcher:
    """Send each occurrence as a real Celery task (`task_id` = the occurrence id).

    The template's `options` (queue, priority, expires, headers, exchange, routing_key, ...)
    are passed to `apply_async`; without a queue, exchange or routing key the task goes to the
    registry's queue (which, for a `beat_schedule` entry, is where the task's routing sends
    it). `dispatch` returns once `apply_async` returns, `dispatch_batch` once the batch is
    published; with RabbitMQ set `broker_transport_options={"confirm_publish": True}` to make
    that mean "accepted".

    A template with no usable task is a `PermanentDispatchError` (the pump parks its
    registration). A task name the app does not know is sent by name, as Celery's beat does,
    since a worker of another service may define it; with `known_tasks_only=True` it is a
    `PermanentDispatchError` too. A broker that refuses is a `DispatchError`, retried.
    """

    def __init__(self, app: Celery, *, known_tasks_only: bool = False) -> None:
        self.app = app
        self.known_tasks_only = known_tasks_only

    def check_task(self, task: str) -> None:
        """Raise `PermanentDispatchError` unless the app defines `task` (`app.tasks`).

        What `emq-bridge add --celery SPEC` asks before it writes a schedule.
        """
        if task not in self.app.tasks:
            raise PermanentDispatchError(
                f"task {task!r} is not a task of the Celery app {self.app.main or 'app'!r}: "
                "import the module that defines it"
            )

    def dispatch(self, occurrence: Occurrence) -> None:
        self.send(occurrence, occurrence.id, occurrence.due_ms)

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[BaseException | None]:
        """Send a claimed batch, each through `apply_async`, on one producer.

        Where kombu can batch publishes (`Producer.batch()`, kombu 5.7+, the Redis
        transport), the batch's messages reach the broker in one pipeline when the batch
        ends; every signal and hook still runs per message. If that pipeline fails, delivery
        of the whole batch is uncertain, so every message is reported failed and comes back
        with the same id when its lease expires. Elsewhere each message is published as sent.
        """
        errors: list[BaseException | None] = [None] * len(occurrences)
        try:
            with self.app.producer_or_acquire() as producer:
                if not getattr(producer, "supports_batch_publish", False):
                    self._send_each(occurrences, errors, producer)
                    return errors
                # Room for every publish (and x-expires refreshes): one flush, at the end.
                with producer.batch(max_size=16 * len(occurrences) + 16):
                    self._send_each(occurrences, errors, producer)
        except Exception as exc:  # no producer, or the pipeline failed: nothing is known in
            failure = batch_failure(exc)
            return [error or failure for error in errors]
        return errors

    def _send_each(
        self,
        occurrences: Sequence[Occurrence],
        errors: list[BaseException | None],
        producer: Any,
    ) -> None:
        for index, occurrence in enumerate(occurrences):
            try:
                self.send(occurrence, occurrence.id, occurrence.due_ms, producer=producer)
            except Exception as exc:
                errors[index] = exc

    def send(
        self, occurrence: Occurrence, task_id: str, due: int | str, producer: Any = None
    ) -> None:
        """Send `occurrence` as task `task_id` with nominal time `due` through `apply_async`.

        `PipelinedCeleryDispatcher` calls it with marker values and a capturing producer.
        """
        # A permanent error names no registration: the pipelined path sends a marked copy.
        try:
            template = TaskTemplate.read(occurrence.template)
        except ScheduleError as exc:
            raise PermanentDispatchError(f"its template cannot be sent: {exc}") from exc
        name = template.task
        options = dict(template.options)
        headers = dict(options.pop("headers", None) or {})
        headers.update(
            {
                BEAT_HEADER: True,
                DUE_HEADER: due,
                SCHEDULE_HEADER: f"{occurrence.queue}/{occurrence.name}",
            }
        )
        if not {"queue", "exchange", "routing_key"} & options.keys():
            options["queue"] = occurrence.queue
        if producer is not None:
            options["producer"] = producer
        args = list(template.args)
        kwargs = dict(template.kwargs)
        task = self.app.tasks.get(name)
        if task is None and self.known_tasks_only:
            self.check_task(name)
        try:
            if task is not None:
                task.apply_async(args, kwargs, task_id=task_id, headers=headers, **options)
            else:
                self.app.send_task(name, args, kwargs, task_id=task_id, headers=headers, **options)
        except Exception as exc:
            where = f"{occurrence.queue}/{occurrence.name}"
            raise DispatchError(f"{where}: sending {name!r} failed: {exc}") from exc


def nominal_due_ms(request: Any) -> int | None:
    """Return the nominal time (epoch ms) of the occurrence a task serves, or None.

    Pass `self.request` in a bound task (or the task itself).
    """
    if isinstance(request, Task):
        request = request.request
    value = getattr(request, DUE_HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(DUE_HEADER)
    return None if value is None else int(value)


def nominal_time(request: Any) -> datetime | None:
    """Return the nominal time of the occurrence a task serves (aware, UTC), or None."""
    due_ms = nominal_due_ms(request)
    return None if due_ms is None else datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc)
