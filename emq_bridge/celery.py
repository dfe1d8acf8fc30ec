"""Celery integration: a drop-in `celery beat` scheduler, a dispatcher, a decorator, boot sync.

```python
app.conf.beat_scheduler = "emq_bridge.celery:RepeatScheduler"   # or: celery beat -S emq
app.conf.emq_bridge_redis_url = "redis://localhost:6379/0"       # default: the Redis broker

@recurring(cron="0 9 * * *", tz="Europe/Paris")
@app.task
def digest() -> None: ...
```

Settings (all optional, in `app.conf`):

* `emq_bridge_redis_url`: where the registry lives; default the broker URL when the broker
  is Redis (`redis://`, `rediss://`, `redis+socket://`), else required.
* `emq_bridge_prefix`: key prefix, default `"emq"`.
* `emq_bridge_source`: owner tag of this app's schedules, default `"celery.<app.main>"`.
* `emq_bridge_queues`: extra queues to pump (registrations added at runtime elsewhere).
* `emq_bridge_schedule_file`: a TOML schedule file (`emq_bridge.config`) synced at boot.
* `emq_bridge_check_tasks`: refuse unknown task names at boot, default True.
* `emq_bridge_pipelined`: send through `PipelinedCeleryDispatcher` (the opt-in fast path
  on a Redis broker), default False.

Each occurrence is sent as a real task: `task_id` is the occurrence id, the headers carry
`celery_beat_task` (as Celery's beat sets), `emq_due_ms` (the nominal time, read it with
`nominal_time(self.request)`) and `emq_schedule` (`"<queue>/<name>"`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from celery import Celery, Task
from celery.beat import Scheduler, SchedulingError
from kombu.utils.url import maybe_sanitize_url

from ._celery_declare import (
    AppSchedule,
    app_schedule,
    recurring,
    registry_url,
    repeat_for,
    sync_app,
)
from ._celery_pipelined import PipelinedCeleryDispatcher
from .dispatch import PumpTarget, batch_failure
from .errors import ConfigError, DispatchError, EmqError
from .pump import Pump
from .registry import Occurrence

__all__ = [
    "AppSchedule",
    "CeleryDispatcher",
    "PipelinedCeleryDispatcher",
    "RepeatScheduler",
    "app_schedule",
    "load_target",
    "nominal_due_ms",
    "nominal_time",
    "recurring",
    "registry_url",
    "sync_app",
]

log = logging.getLogger(__name__)

DUE_HEADER = "emq_due_ms"
SCHEDULE_HEADER = "emq_schedule"
BEAT_HEADER = "celery_beat_task"


# -- sending ----------------------------------------------------------------------------


class CeleryDispatcher:
    """Send each occurrence as a real Celery task (`task_id` = the occurrence id).

    The template's `options` (queue, priority, expires, headers, exchange, routing_key, ...)
    are passed to `apply_async`; without a queue, exchange or routing key the task goes to the
    registry's queue (which, for a `beat_schedule` entry, is where the task's routing sends
    it). `dispatch` returns once `apply_async` returns, `dispatch_batch` once the batch is
    published; with RabbitMQ set `broker_transport_options={"confirm_publish": True}` to make
    that mean "accepted".
    """

    def __init__(self, app: Celery) -> None:
        self.app = app

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
        template = occurrence.template
        name = template.get("task")
        if not isinstance(name, str) or not name:
            raise DispatchError(f"{occurrence.queue}/{occurrence.name}: template has no 'task'")
        options = dict(template.get("options") or {})
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
        args = list(template.get("args") or ())
        kwargs = dict(template.get("kwargs") or {})
        task = self.app.tasks.get(name)
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


def load_target(spec: str, *, pipelined: bool = False) -> PumpTarget:
    """Return the pump target of the Celery app `spec` ("proj" or "proj.celery:app").

    `pipelined=True` sends through `PipelinedCeleryDispatcher` (a Redis broker only).

    The app is found the way `celery -A` finds it, and its task modules are imported.
    Schedule-file entries are not included (they have their own source).
    """
    from celery.app.utils import find_app

    try:
        app = find_app(spec)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the Celery app {spec!r}: {exc}") from exc
    if not isinstance(app, Celery):
        raise ConfigError(f"{spec!r} is {type(app).__name__}, not a Celery app")
    app.loader.import_default_modules()
    app.finalize(auto=True)
    plan = app_schedule(app)
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    return PumpTarget(dispatcher, plan.queues, plan.declarations, plan.source, plan.resolve_cadence)


# -- the beat scheduler -----------------------------------------------------------------


class RepeatScheduler(Scheduler):  # type: ignore[misc]
    """`celery beat` on the Repeat registry: any number of beats, each occurrence sent once.

    At start it validates and syncs the app's schedules (refusing to run if that fails),
    then every tick claims what is due through the registry. State lives in Redis, so a
    restart neither resets countdowns nor fires extra runs. `lazy=True` touches nothing.
    """

    #: Seconds between registry checks at most, so runtime changes are picked up quickly.
    max_interval = 5

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        self.pump: Pump | None = None
        self.plan: AppSchedule | None = None
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        """Validate and sync the app's schedules, then build the pump; raise if either fails."""
        repeat = None
        try:
            plan = app_schedule(self.app)
            repeat = repeat_for(self.app)
            sync_app(self.app, repeat, plan)
        except Exception as exc:
            if repeat is not None:
                repeat.client.close()
            log.error("emq-bridge beat refuses to start: %s", exc)
            if isinstance(exc, EmqError):
                raise
            raise ConfigError(f"emq-bridge beat could not sync its schedules: {exc}") from exc
        self.plan = plan
        pipelined = bool(self.app.conf.get("emq_bridge_pipelined", False))
        self.pump = Pump(
            repeat,
            plan.queues,
            PipelinedCeleryDispatcher(self.app) if pipelined else CeleryDispatcher(self.app),
            resolve_cadence=plan.resolve_cadence,
            max_sleep_s=float(self.max_interval),
        )
        self.pump.check_eviction_policy()
        log.info(
            "emq-bridge beat: %d schedule(s) synced; pumping %s",
            len(plan.declarations),
            ", ".join(plan.queues),
        )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send everything due now through the registry; return the seconds to sleep.

        Outages and broken queues are handled (logged once, retried) by `Pump.step`, so
        beat's service loop never exits on them.
        """
        if self.pump is None:
            raise SchedulingError("emq-bridge beat has no synced registry; it refuses to run")
        tick, delay = self.pump.step()
        for occurrence in tick.dispatched if tick is not None else ():
            log.info(
                "Scheduler: sent %s/%s (%s) id %s",
                occurrence.queue,
                occurrence.name,
                occurrence.template.get("task"),
                occurrence.id,
            )
        return float(min(self.max_interval, delay))

    def sync(self) -> None:
        """Nothing to save: every move was written to Redis when it happened."""

    def close(self) -> None:
        """Release the broker connection (Celery's part) and the registry's connection."""
        super().close()
        if self.pump is not None:
            if isinstance(self.pump.dispatcher, PipelinedCeleryDispatcher):
                self.pump.dispatcher.close()
            self.pump.repeat.client.close()

    @property
    def info(self) -> str:
        """Return the banner line naming the registry (touches nothing)."""
        try:
            where = maybe_sanitize_url(registry_url(self.app))
        except EmqError as exc:  # the banner must not fail; setup_schedule reports it
            where = f"not configured ({exc})"
        return f"    . registry -> {where} (emq-bridge)"
