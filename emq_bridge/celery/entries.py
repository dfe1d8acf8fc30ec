"""Convert Celery's schedule objects and `beat_schedule` entries into registry declarations.

Part of `emq_bridge.celery`.

* `schedule` (numbers, `timedelta`) becomes `Every` (drift-free, anchored on the schedule);
* `crontab` becomes `Cron` in the crontab's time zone (the app's `timezone`, honouring
  `enable_utc`), with Celery's AND of day-of-month and day-of-week;
* anything else (`solar`, `schedule(relative=True)`, custom classes) becomes a
  `CelerySchedule`: its next runs come from the object's own `remaining_estimate` (or
  `is_due`), computed in the process that holds the object.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from celery import Celery
from celery.beat import BeatLazyFunc, ScheduleEntry
from celery.schedules import BaseSchedule, crontab, schedule
from kombu.entity import Exchange, Queue

from ..cadence import Cadence, Cron, Every
from ..definition import Declaration, Definition
from ..errors import ConfigError, EmqError
from ..keys import validate_name
from ..template import TaskTemplate

__all__ = [
    "PLACEHOLDER_EVERY_MS",
    "CelerySchedule",
    "convert_entry",
    "convert_schedule",
    "crontab_expr",
    "json_options",
    "registry_name",
    "resolve_queue",
    "zone_name",
]

# What a plain pump (one without the Celery app's objects) uses for a custom schedule.
PLACEHOLDER_EVERY_MS = 86_400_000
# A custom schedule that is always due fires at most once per this many ms.
MIN_CUSTOM_STEP_MS = 1000
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_BAD_NAME_CHARS = re.compile(r"[\s{}\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True, eq=False)
class CelerySchedule:
    """A cadence driven by a Celery schedule object's own `remaining_estimate` / `is_due`.

    Stored in the registry as a daily placeholder interval; the process that holds the object
    (beat, or `emq-bridge pump --celery`) computes the real next runs (epoch ms, UTC).
    """

    schedule: Any
    label: str

    @property
    def kind(self) -> str:
        return "celery"

    def first_run(self, now_ms: int) -> int:
        return self.next_after(now_ms)

    def next_after(self, after_ms: int) -> int:
        clock = getattr(self.schedule, "now", None)
        now = clock() if callable(clock) else datetime.now(timezone.utc)
        # Work in UTC: aware arithmetic in a zone with DST is wall-clock arithmetic.
        now = (
            now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)
        )
        after = datetime.fromtimestamp(after_ms / 1000, tz=timezone.utc)
        pinned = isinstance(self.schedule, BaseSchedule)
        if pinned:  # one "now" for the whole computation, so the result is exact
            saved, self.schedule.nowfun = self.schedule.nowfun, lambda: now
        try:
            try:
                seconds = self.schedule.remaining_estimate(after).total_seconds()
            except NotImplementedError:
                due, check_s = self.schedule.is_due(after)
                seconds = 0.0 if due else float(check_s)
        finally:
            if pinned:
                self.schedule.nowfun = saved
        next_ms = round((now + timedelta(seconds=seconds)).timestamp() * 1000)
        # A schedule that names no instant after `after_ms` (always due) is checked again
        # a second later, as Celery's beat would after firing it.
        return next_ms if next_ms > after_ms else after_ms + MIN_CUSTOM_STEP_MS

    def to_fields(self) -> dict[str, str]:
        return Every(PLACEHOLDER_EVERY_MS).to_fields()

    def describe(self) -> str:
        return f"celery {self.label}"


def registry_name(key: str) -> str:
    """Return the registration name of a `beat_schedule` key: whitespace and braces become `_`."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"beat_schedule key {key!r} must be a non-empty string")
    name = _BAD_NAME_CHARS.sub("_", key)
    try:
        return validate_name(name, "registration name")
    except EmqError as exc:
        raise ConfigError(f"beat_schedule[{key!r}]: {exc}") from exc


def zone_name(tz: tzinfo) -> str:
    """Return the IANA name of a Celery time zone; raise `ConfigError` if it has none."""
    key = getattr(tz, "key", None) or getattr(tz, "zone", None)
    if isinstance(key, str) and key:
        return key
    if tz is timezone.utc or (tz.utcoffset(None) == timedelta(0) and tz.tzname(None) == "UTC"):
        return "UTC"
    local = _local_zone_name()
    if type(tz).__name__ == "LocalTimezone" and local:
        return local
    raise ConfigError(
        f"time zone {tz!r} has no IANA name; set app.conf.timezone = 'Europe/Paris' (say)"
    )


def _local_zone_name() -> str | None:
    """Return the host's IANA zone ($TZ, /etc/localtime, /etc/timezone), or None."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        resolved = str(Path("/etc/localtime").resolve())
        candidates.append(resolved.split("zoneinfo/", 1)[1] if "zoneinfo/" in resolved else "")
    except OSError:
        pass
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text("utf-8").strip())
    for name in candidates:
        if name:
            try:
                ZoneInfo(name)
            except (ValueError, KeyError, OSError):
                continue
            return name
    return None


def _field(values: Iterable[int], low: int, high: int, *, star: bool = True) -> str:
    ordered = sorted(values)
    if ordered == list(range(low, high + 1)):
        return "*" if star else f"{low}-{high}"
    return ",".join(str(v) for v in ordered)


def crontab_expr(entry: crontab) -> tuple[str, bool]:
    """Return the 5-field cron expression of a Celery `crontab`, and whether days are ANDed.

    Only an every-hour crontab gets a `*` hour (cron's DST rule then follows elapsed time);
    every other minute and hour field is written out, so fixed wall-clock times follow the
    fixed-time rule (see `emq_bridge.cadence`), as Celery's own crontab mostly does.
    """
    minute = _field(entry.minute, 0, 59, star=False)
    hour = _field(entry.hour, 0, 23)
    dom = _field(entry.day_of_month, 1, 31)
    moy = _field(entry.month_of_year, 1, 12)
    dow = _field(entry.day_of_week, 0, 6)
    return f"{minute} {hour} {dom} {moy} {dow}", dom != "*" and dow != "*"


def _plain(obj: object, base: type, *methods: str) -> bool:
    """True if `obj` is a `base` whose timing methods are the base's own."""
    return isinstance(obj, base) and all(getattr(type(obj), m) is getattr(base, m) for m in methods)


def _check_schedule_value(value: Any, label: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise ConfigError(
            f"{label}: schedule {value!r} is not a schedule; use seconds, a timedelta, "
            "celery.schedules.schedule, crontab or solar"
        )


def convert_schedule(value: Any, app: Celery, label: str) -> Cadence:
    """Return the cadence of a Celery schedule (number, `timedelta`, `schedule`, `crontab`, ...)."""
    _check_schedule_value(value, label)
    if isinstance(value, (int, float, timedelta)):
        value = schedule(value, app=app)
    if not (hasattr(value, "is_due") or hasattr(value, "remaining_estimate")):
        raise ConfigError(f"{label}: {value!r} is not a schedule (it has no is_due)")
    value.app = app
    if _plain(value, schedule, "is_due", "remaining_estimate") and not value.relative:
        seconds = value.run_every.total_seconds()
        if seconds <= 0 or seconds * 1000 < 1:
            raise ConfigError(f"{label}: the interval must be positive, got {seconds}s")
        return Every(round(seconds * 1000))
    if _plain(value, crontab, "is_due", "remaining_estimate", "remaining_delta"):
        expr, day_and = crontab_expr(value)
        try:
            return Cron(expr, zone_name(value.tz), day_and)
        except EmqError as exc:
            raise ConfigError(f"{label}: crontab {value!r}: {exc}") from exc
    return CelerySchedule(value, _ADDRESS.sub("", repr(value)))


def json_options(options: Mapping[str, Any], label: str) -> dict[str, Any]:
    """Return `options` as JSON: a kombu `Queue`/`Exchange` becomes its name."""
    out: dict[str, Any] = {}
    for key, given in options.items():
        if key == "task_id":
            raise ConfigError(f"{label}: options['task_id'] is set by emq-bridge")
        value = given.name if isinstance(given, (Queue, Exchange)) else given
        if isinstance(value, datetime):
            raise ConfigError(
                f"{label}: options[{key!r}] is a datetime; a recurring task needs a relative "
                "value (seconds)"
            )
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{label}: options[{key!r}] = {value!r} is not JSON") from exc
        out[key] = value
    return out


def resolve_queue(
    app: Celery, task_name: str, options: Mapping[str, Any], args: Any, kwargs: Any
) -> str:
    """Return the Celery queue a task is sent to: the options, else the task's routing."""
    task = app.tasks.get(task_name)
    preset = {k: v for k, v in (task._get_exec_options() if task else {}).items() if v is not None}
    merged = dict(preset, **options)
    try:
        route = app.amqp.router.route(merged, task_name, args, kwargs, task_type=task)
    except Exception as exc:  # task_routes callables and QueueNotFound
        raise ConfigError(f"cannot route task {task_name!r}: {exc}") from exc
    queue = route.get("queue")
    name = queue.name if isinstance(queue, Queue) else queue
    return str(name or app.conf.task_default_queue)


def _lazy_free(values: Iterable[Any], label: str) -> None:
    for value in values:
        if isinstance(value, BeatLazyFunc):
            raise ConfigError(f"{label}: BeatLazyFunc arguments are not supported; use values")


def convert_entry(
    app: Celery, key: str, raw: Any, *, check_task: bool = True
) -> tuple[Declaration, CelerySchedule | None]:
    """Return the declaration of one `beat_schedule` entry; raise `ConfigError` if it is bad."""
    label = f"beat_schedule[{key!r}]"
    if isinstance(raw, ScheduleEntry):
        entry = raw
    elif isinstance(raw, Mapping):
        if "schedule" in raw:  # maybe_schedule fails on a string with an AttributeError
            _check_schedule_value(raw["schedule"], label)
        try:
            entry = ScheduleEntry(**dict(raw, name=key, app=app))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{label}: Celery rejects this entry: {exc}") from exc
    else:
        raise ConfigError(f"{label} must be a dict, got {type(raw).__name__}")
    task = entry.task
    if not isinstance(task, str) or not task:
        raise ConfigError(f"{label} has no 'task' (the name of the task to send)")
    if check_task and task not in app.tasks:
        raise ConfigError(
            f"{label}: unknown task {task!r}; import the module that defines it "
            "(app.conf.imports / include / autodiscover_tasks), or set "
            "app.conf.emq_bridge_check_tasks = False to send it by name"
        )
    args = list(entry.args or ())
    kwargs = dict(entry.kwargs or {})
    _lazy_free([*args, *kwargs.values()], label)
    options = json_options(entry.options or {}, label)
    cadence = convert_schedule(entry.schedule, app, label)
    custom = cadence if isinstance(cadence, CelerySchedule) else None
    try:
        template = TaskTemplate(task, args, kwargs, options).to_dict()
        if custom is not None:  # so an edited custom schedule is a changed definition
            template["schedule"] = custom.label
        definition = Definition(cadence, template)
        queue = resolve_queue(app, task, options, args, kwargs)
        declaration = Declaration(queue, registry_name(key), definition)
    except EmqError as exc:
        raise ConfigError(f"{label}: {exc}") from exc
    return declaration, custom
