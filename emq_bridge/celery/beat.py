"""`RepeatScheduler`: `celery beat` on the Repeat registry (`celery beat -S emq`)."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.beat import Scheduler, SchedulingError
from kombu.utils.url import maybe_sanitize_url

from ..errors import ConfigError, EmqError
from ..events import PumpEvents
from ..occurrence import Occurrence
from ..pump import Pump
from .declare import AppSchedule, app_schedule, registry_url, repeat_for, sync_app
from .dispatch import CeleryDispatcher
from .pipelined import PipelinedCeleryDispatcher

__all__ = ["RepeatScheduler"]

log = logging.getLogger("emq_bridge.celery")


class BeatLog(PumpEvents):
    """The beat's log line per task sent, as Celery's own beat writes one."""

    def on_dispatch(self, occurrence: Occurrence) -> None:
        log.info(
            "Scheduler: sent %s/%s (%s) id %s",
            occurrence.queue,
            occurrence.name,
            occurrence.template.get("task"),
            occurrence.id,
        )


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
                repeat.close()
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
            listeners=[BeatLog()],
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
        _, delay = self.pump.step()
        return float(min(self.max_interval, delay))

    def sync(self) -> None:
        """Nothing to save: every move was written to Redis when it happened."""

    def close(self) -> None:
        """Release the broker connection (Celery's part) and the registry's connection."""
        super().close()
        if self.pump is not None:
            if isinstance(self.pump.dispatcher, PipelinedCeleryDispatcher):
                self.pump.dispatcher.close()
            self.pump.repeat.close()

    @property
    def info(self) -> str:
        """Return the banner line naming the registry (touches nothing)."""
        try:
            where = maybe_sanitize_url(registry_url(self.app))
        except EmqError as exc:  # the banner must not fail; setup_schedule reports it
            where = f"not configured ({exc})"
        return f"    . registry -> {where} (emq-bridge)"
