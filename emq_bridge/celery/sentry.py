"""Sentry Crons for `celery beat -S emq`: the check-ins Celery's own beat gets from sentry-sdk.

With `sentry_sdk.init(integrations=[CeleryIntegration(monitor_beat_tasks=True)])`, sentry-sdk
patches `celery.beat.Scheduler.apply_entry`: before each `beat_schedule` entry is sent it
captures an `in_progress` check-in (monitor slug: the entry's name; monitor config: its
crontab or whole-minute interval and time zone) and adds the headers `sentry-monitor-slug`,
`sentry-monitor-config` and `sentry-monitor-check-in-id` to the task, whose `ok`/`error`
check-ins the worker then sends from Celery's task signals. `RepeatScheduler` never calls
`apply_entry`, so `BeatMonitors` does the beat's half for each occurrence the pump sends: the
same check-in and headers, built the same way, so the worker's half (sentry-sdk's own
signal receivers) works unchanged.

Two differences, both for the better: the check-in id is the occurrence id (as hex), so an
occurrence sent again after a crash (same id) re-sends the same check-in instead of leaving
one open forever; and a `trigger`ed occurrence, a run off the schedule, gets no check-in
(as a task sent by hand gets none from Celery's beat).

Nothing here runs unless sentry-sdk is installed and its client has the Celery integration
with `monitor_beat_tasks=True` (read again for each occurrence, as sentry-sdk's patch does).
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from ..errors import EmqError
from ..occurrence import Occurrence
from .entries import convert_entry

__all__ = ["BeatMonitors", "beat_monitors", "monitor_config", "monitoring"]

log = logging.getLogger(__name__)

SLUG_HEADER = "sentry-monitor-slug"
CONFIG_HEADER = "sentry-monitor-config"
CHECK_IN_HEADER = "sentry-monitor-check-in-id"
# The keys of a `beat_schedule` entry that Celery's ScheduleEntry takes (emq-bridge's own,
# such as `overlap`, are not Celery's).
_ENTRY_KEYS = ("task", "schedule", "args", "kwargs", "options", "relative")
# A crontab's fields as given (Celery keeps them as `_orig_<field>`), in cron's order.
_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
# Sentry Crons intervals: the largest unit dividing the interval (sentry_sdk.crons.utils).
_UNITS = (("day", 86_400), ("hour", 3_600), ("minute", 60))


def _celery_integration() -> Any:
    """Return sentry-sdk's active Celery integration, else None."""
    if "sentry_sdk.integrations.celery" not in sys.modules:
        # Not loaded, so not active. Importing it would import celery-redbeat where it is
        # installed (sentry-sdk patches it), whose `beat_init` receiver assumes its own
        # scheduler.
        return None
    try:
        import sentry_sdk
        from sentry_sdk.integrations.celery import CeleryIntegration
    except ImportError:  # sentry-sdk (or its Celery integration) is not installed
        return None
    return sentry_sdk.get_client().get_integration(CeleryIntegration)


def _integration() -> Any:
    """Return sentry-sdk's active Celery integration if it monitors beat tasks, else None."""
    integration = _celery_integration()
    if integration is None or not integration.monitor_beat_tasks:
        return None
    return integration


def monitoring() -> bool:
    """Return whether sentry-sdk is set to monitor beat tasks in this process."""
    return _integration() is not None


def monitor_config(celery_schedule: Any, app: Celery, slug: str) -> dict[str, Any]:
    """Return the Sentry monitor config of a Celery schedule, as sentry-sdk builds it for
    Celery's beat: a crontab's five fields as given, or an interval in whole minutes, hours
    or days, with the schedule's time zone (else the app's, else UTC). `{}` for what Sentry
    Crons cannot monitor (an interval under a minute or not whole minutes, a solar or custom
    schedule), logged as sentry-sdk does."""
    if isinstance(celery_schedule, crontab):
        config: dict[str, Any] = {
            "schedule": {
                "type": "crontab",
                "value": " ".join(str(getattr(celery_schedule, f"_orig_{f}")) for f in _FIELDS),
            }
        }
    elif isinstance(celery_schedule, schedule):
        seconds = celery_schedule.seconds
        unit = next(
            ((name, size) for name, size in _UNITS if seconds >= size and seconds % size == 0),
            None,
        )
        if unit is None:
            log.warning(
                "Sentry Crons cannot monitor %r: its interval of %s seconds is not whole "
                "minutes (exclude it with exclude_beat_tasks)",
                slug,
                int(seconds),
            )
            return {}
        config = {
            "schedule": {"type": "interval", "value": int(seconds // unit[1]), "unit": unit[0]}
        }
    else:
        log.warning("Sentry Crons cannot monitor %r: a %s schedule", slug, type(celery_schedule))
        return {}
    tz = getattr(celery_schedule, "tz", None)
    config["timezone"] = (tz is not None and str(tz)) or app.timezone or "UTC"
    return config


class BeatMonitors:
    """The beat's half of Sentry Crons for the `beat_schedule` entries of an app.

    `entries` maps (queue, registration name) to (monitor slug, Celery schedule): the
    entry's key, as Celery's beat names the monitor, and its schedule object.
    """

    def __init__(
        self,
        app: Celery,
        entries: Mapping[tuple[str, str], tuple[str, Any]]
        | Callable[[], Mapping[tuple[str, str], tuple[str, Any]]],
    ) -> None:
        self.app = app
        # A callable is read at the first monitored beat: a beat whose process never turns
        # monitoring on (most, even with sentry-sdk installed) converts its schedule once,
        # for its sync, not twice.
        self._entries = None if callable(entries) else dict(entries)
        self._load = entries
        # Each entry's monitor config, built at its first beat: an entry Sentry Crons cannot
        # monitor is logged once, not at every beat (sentry-sdk logs it only with debug on).
        self._configs: dict[tuple[str, str], dict[str, Any]] = {}
        self._failed = False  # a check-in failed: said once

    @property
    def entries(self) -> dict[tuple[str, str], tuple[str, Any]]:
        """(queue, registration name) -> (monitor slug, Celery schedule)."""
        if self._entries is None and callable(self._load):
            self._entries = dict(self._load())
        return self._entries or {}

    def headers(self, occurrence: Occurrence) -> dict[str, Any] | None:
        """Capture `occurrence`'s `in_progress` check-in and return the headers its task
        carries for the worker's check-in; None when it is not monitored.

        With sentry-sdk's Celery integration active, each task the beat sends, monitored or
        not, starts a new trace, as sentry-sdk's patched apply_entry starts one per entry
        (else a task would join the trace of the last check-in).

        Monitoring never stops a send: a check-in that fails (a sentry-sdk whose API differs)
        is logged, once per beat, and the task goes without it."""
        try:
            return self._headers(occurrence)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                log.warning(
                    "Sentry Crons: no check-in for %s/%s, sent without one (and so may later "
                    "ones be, unlogged): %s: %s",
                    occurrence.queue,
                    occurrence.name,
                    type(exc).__name__,
                    exc,
                )
            return None

    def _headers(self, occurrence: Occurrence) -> dict[str, Any] | None:
        integration = _celery_integration()
        if integration is None:
            return None
        import sentry_sdk

        # The scope's name tells sentry-sdk's apply_async wrapper the beat sent the task.
        scope = sentry_sdk.get_isolation_scope()
        scope.set_new_propagation_context()
        scope._name = "celery-beat"
        if not integration.monitor_beat_tasks or occurrence.triggered:
            return None
        found = self.entries.get((occurrence.queue, occurrence.name))
        if found is None:
            return None
        slug, celery_schedule = found
        from sentry_sdk.crons import MonitorStatus, capture_checkin
        from sentry_sdk.utils import match_regex_list

        if match_regex_list(slug, integration.exclude_beat_tasks):
            return None
        key = (occurrence.queue, occurrence.name)
        config = self._configs.get(key)
        if config is None:
            config = self._configs[key] = monitor_config(celery_schedule, self.app, slug)
        if not config:
            return None
        check_in_id = capture_checkin(
            monitor_slug=slug,
            monitor_config=config,  # type: ignore[arg-type]
            check_in_id=uuid.UUID(occurrence.id).hex,
            status=MonitorStatus.IN_PROGRESS,
        )
        return {SLUG_HEADER: slug, CONFIG_HEADER: config, CHECK_IN_HEADER: check_in_id}


def beat_monitors(app: Celery) -> BeatMonitors | None:
    """Return the beat's monitors of `app`'s `beat_schedule`, or None without sentry-sdk.

    Entries are read as Celery's beat reads them (a `ScheduleEntry` each, the same
    schedule object sentry-sdk would see); one that cannot be converted is skipped (the
    beat's sync has refused it already).
    """
    try:
        import sentry_sdk  # noqa: F401  # installed: monitors decide per occurrence
    except ImportError:
        return None
    if monitoring():  # on already: read them now, not during the first tick
        return BeatMonitors(app, _monitored_entries(app))
    return BeatMonitors(app, lambda: _monitored_entries(app))


def _monitored_entries(app: Celery) -> dict[tuple[str, str], tuple[str, Any]]:
    from .declare import _beat_entries  # what Celery's beat installs, as the beat syncs it

    entries: dict[tuple[str, str], tuple[str, Any]] = {}
    for key, raw in _beat_entries(app).items():
        try:
            declaration, _ = convert_entry(app, key, raw, check_task=False)
            if isinstance(raw, ScheduleEntry):
                entry = raw
            else:
                celery_keys = {k: raw[k] for k in _ENTRY_KEYS if k in raw}
                entry = ScheduleEntry(**dict(celery_keys, name=key, app=app))
        except (EmqError, TypeError, ValueError) as exc:
            log.debug("no Sentry monitor for beat_schedule[%r]: %s", key, exc)
            continue
        entries[(declaration.queue, declaration.name)] = (entry.name, entry.schedule)
    return entries
