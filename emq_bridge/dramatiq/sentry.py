"""Sentry Crons for Dramatiq: a check-in per occurrence a worker runs (`SentryCrons`).

Dramatiq has no beat for sentry-sdk to patch; emq-bridge's occurrences are the scheduled
runs. `SentryCrons` is a middleware that sends, with `sentry_sdk.crons.capture_checkin`, an
`in_progress` check-in when a worker starts a message emq-bridge sent, and `ok` or `error`
(with its duration) when it ends: the check-ins Celery's beat and workers send with
`CeleryIntegration(monitor_beat_tasks=True)`. The monitor slug is the registration's name
(`<queue>-<name>` for a name declared on several queues); its config, for schedules declared
on the broker's actors, their cron expression and time zone or their whole-minute interval,
so Sentry creates the monitor and knows when a run is missed. The check-in id is the
occurrence id (as hex), so every attempt and every re-send of one occurrence is one check-in.

A worker killed mid-run (SIGKILL, OOM) sends no `ok`/`error`: when a pump marks that
occurrence lost (its worker stopped heartbeating), the pump thread of any worker with
`SentryCrons` sends its `error` check-in, as sentry-sdk's Celery receivers do on
`WorkerLostError`. `max_runtime` (minutes) goes into the declared monitors' config.

Triggered occurrences (runs off the schedule), declared schedules Sentry Crons cannot take
(under a minute, a seconds field, `H`, exclusions: one WARNING each) and messages emq-bridge
did not send get no check-in; a jittered schedule is monitored as its slots' cadence, with a
check-in margin that covers the jitter; a registration added at runtime (not declared on an
actor) gets check-ins without a config.
Nothing is sent unless sentry-sdk is initialised in the worker process.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware

from ..cadence import CRON_ALIASES, Cadence, Cron, Every
from ..errors import ConfigError
from ..events import PumpEvents
from ..jitter import Jittered
from ..occurrence import occurrence_id
from .middleware import RecurringMiddleware
from .schedule import broker_declarations, occurrence_of

__all__ = ["SentryCrons", "monitor_config_of"]

log = logging.getLogger(__name__)

_UNITS = (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000))


def monitor_config_of(cadence: Cadence) -> dict[str, Any]:
    """Return the Sentry monitor config of a cadence, as sentry-sdk builds Celery's: a
    five-field cron expression and its zone, or an interval in whole minutes, hours or days
    (UTC); an alias (`@daily`) as its five fields. `{}` for what Sentry Crons cannot take
    (seconds fields, `H`, sub-minute or uneven intervals): such a schedule is not monitored,
    as sentry-sdk skips them on Celery. A jittered one is its slots' cadence, with a check-in
    margin that covers the jitter (the minute Sentry allows by default, plus the jitter)."""
    if isinstance(cadence, Jittered):
        config = monitor_config_of(cadence.inner)
        if config:
            config["checkin_margin"] = 1 + -(-cadence.jitter_ms // 60_000)  # whole minutes
        return config
    if isinstance(cadence, Cron):
        fields = CRON_ALIASES.get(cadence.expr.strip().lower(), cadence.expr).split()
        if len(fields) != 5 or any("H" in f or "?" in f for f in fields):
            return {}
        return {"schedule": {"type": "crontab", "value": " ".join(fields)}, "timezone": cadence.tz}
    if isinstance(cadence, Every):
        every_ms = cadence.every_ms
        for unit, size in _UNITS:
            if every_ms >= size and every_ms % size == 0:
                schedule = {"type": "interval", "value": every_ms // size, "unit": unit}
                return {"schedule": schedule, "timezone": "UTC"}
    return {}


class SentryCrons(Middleware):
    """Send Sentry Crons check-ins for the occurrences this worker runs (see the module).

    `slug(queue, name)` names the monitor (default: the registration's name, or
    `<queue>-<name>` for a name the broker's actors declare on several queues, so that each
    schedule has a monitor of its own). `max_runtime` (whole minutes, as sentry-sdk's
    `monitor_config`) is how long Sentry lets a run stay `in_progress` before it marks it a
    timeout; None leaves Sentry's default. Add it to the broker next to
    `RecurringMiddleware`, whose pump thread it then tells to send the `error` check-in of
    an occurrence marked lost; initialise sentry-sdk in the worker process.
    """

    def __init__(
        self, *, slug: Callable[[str, str], str] | None = None, max_runtime: int | None = None
    ) -> None:
        try:
            import sentry_sdk  # noqa: F401  # here, not at each message's check-in
        except ImportError:
            raise ImportError(
                "SentryCrons needs sentry-sdk: pip install 'emq-bridge[sentry]'"
            ) from None
        if max_runtime is not None and (type(max_runtime) is not int or max_runtime <= 0):
            raise ConfigError(
                f"SentryCrons(max_runtime=...) must be a positive whole number of minutes, "
                f"got {max_runtime!r}"
            )
        self.max_runtime = max_runtime
        self.slug = slug or self._default_slug
        self._configs: dict[tuple[str, str], dict[str, Any]] | None = None
        self._shared_names: frozenset[str] = frozenset()  # declared on several queues
        # The start of each attempt in progress, by message id (worker threads add and pop
        # their own: one dict operation each, atomic under the GIL).
        self._started: dict[str, float] = {}

    def _config(self, broker: dramatiq.Broker, queue: str, name: str) -> dict[str, Any] | None:
        """Return the monitor config of a declared schedule (`{}`: one Sentry Crons cannot
        monitor), or None for a registration the actors do not declare (added at runtime:
        its monitor is configured in Sentry)."""
        if self._configs is None:  # the actors are declared by the time messages run
            declared = broker_declarations(broker)
            counts = Counter(d.name for d in declared)
            self._shared_names = frozenset(n for n, count in counts.items() if count > 1)
            configs = {}
            for d in declared:
                config = configs[(d.queue, d.name)] = monitor_config_of(d.definition.cadence)
                if config and self.max_runtime is not None:
                    config["max_runtime"] = self.max_runtime
                if not config:  # said once per schedule, as emq-bridge's Celery side does
                    log.warning(
                        "Sentry Crons cannot monitor %s/%s (%s): it gets no check-ins",
                        d.queue,
                        d.name,
                        d.definition.cadence.describe(),
                    )
            self._configs = configs
        return self._configs.get((queue, name))

    def _default_slug(self, queue: str, name: str) -> str:
        return f"{queue}-{name}" if name in self._shared_names else name

    def before_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        # Before any `after_worker_boot`: the pump threads start there, with these listeners.
        for middleware in broker.middleware:
            if isinstance(middleware, RecurringMiddleware) and not any(
                isinstance(known, _LostCheckIns) and known.crons is self
                for known in middleware.listeners
            ):
                listener = _LostCheckIns(self, broker, middleware)
                middleware.listeners = (*middleware.listeners, listener)

    def lost(
        self, broker: dramatiq.Broker, prefix: str, queue: str, name: str, due_ms: int, ident: str
    ) -> None:
        """Send the `error` check-in of the occurrence `ident` (of `name`, due at `due_ms`) a
        pump of the registry `prefix` marked lost, if `before_process_message` would have
        opened one: not for a trigger, nor for a schedule Sentry Crons cannot take."""
        if ident != occurrence_id(prefix, queue, name, due_ms):  # a trigger's (or garbage)
            return
        config = self._config(broker, queue, name)
        if config == {}:
            return
        from sentry_sdk.crons import MonitorStatus, capture_checkin

        capture_checkin(
            monitor_slug=self.slug(queue, name),
            check_in_id=uuid.UUID(ident).hex,
            status=MonitorStatus.ERROR,  # no duration: its worker died without telling it
            monitor_config=config,  # type: ignore[arg-type]
        )

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        info = occurrence_of(message)
        if info is None or info.triggered:
            return
        config = self._config(broker, info.queue, info.name)
        if config == {}:  # declared, but not a schedule Sentry Crons takes (as Celery's)
            return
        from sentry_sdk.crons import MonitorStatus, capture_checkin

        self._started[message.message_id] = time.monotonic()
        capture_checkin(
            monitor_slug=self.slug(info.queue, info.name),
            check_in_id=uuid.UUID(info.id).hex,
            status=MonitorStatus.IN_PROGRESS,
            monitor_config=config,  # type: ignore[arg-type]
        )

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end(broker, message, exception is None)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self._end(broker, message, True)  # skipped by a middleware: not a failed run

    def _end(self, broker: dramatiq.Broker, message: Any, ok: bool) -> None:
        started = self._started.pop(message.message_id, None)
        info = occurrence_of(message)
        if started is None or info is None:
            return
        from sentry_sdk.crons import MonitorStatus, capture_checkin

        capture_checkin(
            monitor_slug=self.slug(info.queue, info.name),
            check_in_id=uuid.UUID(info.id).hex,
            status=MonitorStatus.OK if ok else MonitorStatus.ERROR,
            duration=time.monotonic() - started,
            monitor_config=self._config(broker, info.queue, info.name),  # type: ignore[arg-type]
        )


class _LostCheckIns(PumpEvents):
    """The pump listener `SentryCrons` adds to a `RecurringMiddleware`: the `error` check-in
    of each occurrence its pump marks lost. The worker that opened the check-in is dead;
    whichever worker's pump notices sends it, once (a mark is a compare-and-set)."""

    def __init__(
        self, crons: SentryCrons, broker: dramatiq.Broker, middleware: RecurringMiddleware
    ) -> None:
        self.crons = crons
        self._broker = broker
        self._middleware = middleware

    def on_lost(self, queue: str, name: str, due_ms: int, occurrence_id: str) -> None:
        prefix = self._middleware.registry(self._broker).prefix  # opened at boot, so cached
        self.crons.lost(self._broker, prefix, queue, name, due_ms, occurrence_id)
