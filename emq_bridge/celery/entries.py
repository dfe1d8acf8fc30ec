"""Convert Celery's schedule objects and `beat_schedule` entries into registry declarations.

Part of `emq_bridge.celery`.

* `schedule` (numbers, `timedelta`) becomes `Every` on the epoch grid (a 15-minute entry
  fires at :00/:15/:30/:45 UTC; `offset` shifts it);
* `crontab` becomes `Cron` in the crontab's time zone (the app's `timezone`, honouring
  `enable_utc`), with Celery's AND of day-of-month and day-of-week;
* anything else (`solar`, `schedule(relative=True)`, custom classes) becomes a
  `CelerySchedule`, checked as Celery's beat checks it: `is_due` decides, in the process
  that holds the object.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from celery import Celery
from celery.beat import DEFAULT_MAX_INTERVAL, BeatLazyFunc, ScheduleEntry
from celery.local import Proxy
from celery.schedules import BaseSchedule, crontab, schedule
from kombu.entity import Exchange, Queue

from ..bounds import Bounds, epoch_ms, instants_ms
from ..cadence import MAX_EVERY_MS, At, Cadence, CheckedCadence, Cron, Every, Misfire
from ..definition import (
    Declaration,
    Definition,
    Overlap,
    catchup_window_ms,
    check_misfire,
    check_policies,
    offset_ms,
)
from ..errors import ConfigError, EmqError, ScheduleError
from ..keys import MAX_NAME_BYTES, validate_name
from ..millis import ceil_ms
from ..pump import CORRUPT_PARK_MS
from ..shown import shown
from ..template import TaskTemplate, check_task_name
from .dispatch import routing_option_error
from .kombu_entities import ENTITY_OPTIONS, entity_json
from .routing import resolve_queue
from .setting_names import setting_name

__all__ = [
    "PLACEHOLDER",
    "PLACEHOLDER_EVERY_MS",
    "CelerySchedule",
    "Entries",
    "convert_entry",
    "convert_schedule",
    "crontab_expr",
    "json_options",
    "own_tasks",
    "registry_name",
    "resolve_queue",
    "zone_name",
]

# What a plain pump (one without the Celery app's objects) uses for a custom schedule.
PLACEHOLDER_EVERY_MS = 86_400_000
# ... stored as version 1 stored it (anchor "schedule"), so the digest of a custom schedule
# did not change with the grid default and records written before it still resolve.
PLACEHOLDER = Every(PLACEHOLDER_EVERY_MS, "schedule")
# A custom schedule that is always due fires at most once per this many ms; one that is
# not due is checked again after at least MIN_CHECK_MS (Celery's beat spins on a check in
# 0 s) and at most MAX_CHECK_MS (a score stays a sane epoch ms).
MIN_CUSTOM_STEP_MS = 1000
MIN_CHECK_MS = 10
MAX_CHECK_MS = 366 * 86_400_000
_ZERO = timedelta(0)
log = logging.getLogger("emq_bridge.pump")  # where the pump says an entry is parked
# The record field that names a custom schedule, so that an edit of it is a cadence change.
SCHEDULE_FIELD = "cadence_label"  # a definition field (definition.DEFINITION_FIELDS)
# The `beat_schedule` entry keys that are emq-bridge's, not Celery's (`ScheduleEntry` would
# refuse them): the registration's overlap and failure policies (`Definition`).
POLICY_KEYS = ("overlap", "pause_after_failures", "misfire", "catchup_window", "catchup_max")
# ... and its bounds (bounds.py): the interval's grid offset, start, end, a run limit
# (`one_off: True` is `limit: 1`, as django-celery-beat's one_off), and a first run at once.
WHEN_KEYS = ("offset", "start_at", "end_at", "limit", "one_off", "immediately")
# ... and `at`, instead of `schedule`: one-off instants (django-celery-beat's ClockedSchedule).
AT_KEY = "at"
# ... and `labels`, the registration's tags (a dict of str -> str, labels.py).
LABELS_KEY = "labels"
# The entry keys that are emq-bridge's (Celery's `ScheduleEntry` gets the others).
_OWN_KEYS = frozenset((*POLICY_KEYS, *WHEN_KEYS, AT_KEY, LABELS_KEY))
_WHEN_AND_AT = (*WHEN_KEYS, AT_KEY)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_BAD_NAME_CHARS = re.compile(r"[\s{}\x00-\x1f\x7f]")
# Printable ASCII without space and braces (keys.py's rule): a key made of these alone is
# a valid name with nothing `_BAD_NAME_CHARS` would replace.
_ASCII_NAME = re.compile(r"[!-z|~]+")


@dataclass(frozen=True, slots=True, eq=False)
class CelerySchedule:
    """A Celery schedule object, checked as Celery's beat checks it (a `CheckedCadence`).

    Celery's beat only asks `is_due(last_run_at)`, fires when it says so, and reads its
    second value as "check again in N s". `check` does the same, so the registry's score is
    the next check. A class that defines only `remaining_estimate` (Celery's beat cannot run
    it: the `is_due` it inherits raises) is checked as Celery's own schedules check theirs:
    due once the estimate has passed, checked again when the next one falls. Times are epoch
    ms; the schedule sees them as Celery's beat shows them (`_Instants`): in the app's time
    zone, the pump's clock its `now()` during a check, or by its own `nowfun` if it has one.

    Stored as the placeholder interval plus the schedule's label (`to_fields`): an edit of
    the schedule is a cadence change, so its next check is derived again. A pump without
    the app's objects would fire the placeholder at each check; run `--celery` pumps only.
    """

    schedule: Any
    label: str
    by_is_due: bool = True  # False: the class defines only remaining_estimate
    # How log lines name the entry ("queue/name"; its label if unknown): `convert_entry`
    # sets it. Not part of what the schedule is.
    entry: str = field(default="", compare=False)

    @property
    def kind(self) -> str:
        return "celery"

    def first_run(self, now_ms: int) -> int:
        """Return the first check: now if due, as Celery's beat checks a new entry at once
        (its last run is now), else the check it names. A pump checks again from there."""
        due, next_ms = self._first_check(now_ms)
        return now_ms if due else next_ms

    def next_after(self, after_ms: int) -> int:
        """Return the next check after `after_ms`, for a registration that ran then (or
        starts then: `Bounds.first_run` asks this of a `start_at`)."""
        return self._first_check(after_ms)[1]

    def _first_check(self, at_ms: int) -> tuple[bool, int]:
        """`check(at_ms, at_ms)`; if the schedule's code raises, not due and checked again
        after `CORRUPT_PARK_MS`, logged as the pump logs an entry whose check raises. Celery's
        beat logs "Cannot calculate the next run" and tries again later; an error here must
        not stop the sync that writes the entry (nor every other entry with it)."""
        try:
            return self.check(at_ms, at_ms)
        except Exception as exc:
            log.error(
                "%s: parked for %ds: its next run cannot be computed: %r",
                self.entry or self.describe(),
                CORRUPT_PARK_MS // 1000,
                exc,
            )
            return False, at_ms + CORRUPT_PARK_MS

    def check(self, last_run_ms: int, now_ms: int) -> tuple[bool, int]:
        at = _Instants(self.schedule, now_ms)
        with _clock_pinned(self.schedule, at.now):
            own_now = at.own_now()
            due, next_s = self._is_due(at.seen(last_run_ms, own_now))
            if due and _seconds(next_s) * 1000 < MIN_CUSTOM_STEP_MS:
                # Celery's beat checks again at once, this run now its last one: so do we.
                again, next_s = self._is_due(own_now)
                if again:
                    return True, now_ms + MIN_CUSTOM_STEP_MS
        return due, now_ms + _check_ms(next_s)

    def _is_due(self, last_run: datetime) -> tuple[bool, Any]:
        """Return `is_due(last_run)`: the class's own, or else Celery's (`solar.is_due`'s
        reading of `remaining_estimate`)."""
        if self.by_is_due:
            due, next_s = self.schedule.is_due(last_run)
            return bool(due), next_s
        remaining = self.schedule.remaining_estimate(last_run)
        if isinstance(remaining, timedelta):  # kept exact: `_check_ms` rounds it to the ms
            return remaining <= _ZERO, max(remaining, _ZERO)
        remaining_s = _seconds(remaining)
        return remaining_s <= 0, max(remaining_s, 0)

    def to_fields(self) -> dict[str, str]:
        return {**PLACEHOLDER.to_fields(), SCHEDULE_FIELD: self.label}

    def describe(self) -> str:
        """Return `celery <label>` on one line (a repr may span several: `TzAwareCrontab`'s)."""
        return f"celery {_one_line(self.label)}"


def _one_line(text: str) -> str:
    """Return `text` with each run of whitespace (newlines included) one space, stripped."""
    return " ".join(text.split())


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


class _Instants:
    """The pump's instants (epoch ms) as the datetimes Celery's beat gives a schedule.

    Celery's `app.now()` is the clock in the app's time zone (`app.timezone`: `timezone`,
    else UTC, or the host's zone with `enable_utc = False`); a schedule's `now()` is that,
    unless it has a `nowfun`. An entry's `last_run_at` is its schedule's `now()` when it
    last ran (`ScheduleEntry.default_now()`), and when it was created: a new entry's is now.
    So `now` is the check's instant in the app's zone, which `_clock_pinned` makes the
    schedule's `now()`, and a last run is seen in that zone too; a schedule with a clock of
    its own (a `nowfun`, a class of its own without `nowfun`) sees a last run as that clock
    showed it then: its `now()`, less the time since (its zone, or naive as it is naive).
    """

    __slots__ = ("now", "now_ms", "value")

    def __init__(self, value: Any, now_ms: int) -> None:
        self.value = value
        self.now_ms = now_ms
        self.now = _utc(now_ms).astimezone(_app_zone(value))

    def own_now(self) -> datetime:
        """The schedule's `now()` (the pinned `now` unless it has a clock of its own)."""
        if not _own_clock(self.value):
            return self.now
        read = getattr(self.value, "now", None)
        own = read() if callable(read) else None
        return own if isinstance(own, datetime) else self.now

    def seen(self, last_run_ms: int, own_now: datetime) -> datetime:
        """`last_run_ms` as the schedule's clock showed it (`own_now` is that clock now)."""
        if own_now is self.now:
            return _utc(last_run_ms).astimezone(self.now.tzinfo)
        since = timedelta(milliseconds=self.now_ms - last_run_ms)
        if own_now.tzinfo is None or own_now.utcoffset() is None:
            return own_now - since  # naive, as Celery's beat keeps a naive clock's
        # In UTC: an aware datetime's own arithmetic is its wall clock's, across a DST change.
        return (own_now.astimezone(timezone.utc) - since).astimezone(own_now.tzinfo)


def _app_zone(value: Any) -> tzinfo:
    """The zone of the schedule's app's `now()` (`app.timezone`); UTC for a schedule that
    has no app (a duck-typed class built outside `convert_schedule`)."""
    zone = getattr(getattr(value, "app", None), "timezone", None)
    return zone if isinstance(zone, tzinfo) else timezone.utc


def _own_clock(value: Any) -> bool:
    """True if the schedule keeps a clock of its own (`_clock_pinned` leaves it)."""
    return not isinstance(value, BaseSchedule) or value.nowfun is not None


@contextlib.contextmanager
def _clock_pinned(value: Any, now: datetime) -> Iterator[None]:
    """Make `now` the schedule's `now()` for the block: one instant for the whole check."""
    if _own_clock(value):
        yield  # a duck-typed schedule, or one given a `nowfun`, keeps its own clock
        return
    saved, value.nowfun = value.nowfun, lambda: now
    try:
        yield
    finally:
        value.nowfun = saved


def _seconds(value: Any) -> float:
    """Return `is_due`'s second value in seconds; not a number, Celery's beat waits its max
    interval (300 s by default) and so do we."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    return float(DEFAULT_MAX_INTERVAL)


def _check_ms(value: Any) -> int:
    """Return the ms until the next check, rounded up: a check named for an instant is not
    a hair early. A float is taken to the µs first (a `timedelta`'s precision), so float
    noise (2.047 s is 2047.0000000000002 ms) does not make it a ms late."""
    if isinstance(value, timedelta):
        ms = ceil_ms(value)
    else:  # clamped before the µs, which an inf or a 1e300 would overflow
        seconds = min(max(_seconds(value), 0.0), MAX_CHECK_MS / 1000)
        ms = ceil_ms(timedelta(microseconds=round(seconds * 1_000_000)))
    return min(max(ms, MIN_CHECK_MS), MAX_CHECK_MS)


_CHECKED: type[CheckedCadence] = CelerySchedule  # mypy: CelerySchedule is a CheckedCadence


def registry_name(key: str, what: str | None = None) -> str:
    """Return the registration name of a `beat_schedule` key: whitespace and braces become `_`.
    An error names the entry, or `what` (an importer's "its name": its row is named already)."""
    if not isinstance(key, str) or not key:
        said = f"{what} must be" if what else "beat_schedule keys must be"
        raise ConfigError(f"{said} non-empty strings, got {shown(key)}")
    if len(key) <= MAX_NAME_BYTES and _ASCII_NAME.fullmatch(key):
        return key  # most keys: nothing to replace, a valid name as it is
    name = _shortened(_BAD_NAME_CHARS.sub("_", key))
    try:
        return validate_name(name, "registration name")
    except EmqError as exc:
        raise ConfigError(f"{what or entry_label(key)}: {exc}") from exc


# What an over-long key keeps of itself, in UTF-8 bytes, before `~` and its digest.
_KEPT_BYTES = MAX_NAME_BYTES - 1 - 16


def _shortened(name: str) -> str:
    """`name` if it fits a registration name, else its first `_KEPT_BYTES` bytes (whole
    characters), `~` and 16 hex characters of its SHA-256: the same name at every start, and
    another for any other key. Celery keys an unnamed `add_periodic_task` by the signature's
    repr, which long args make longer than a name may be (Celery's beat takes any key)."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:  # not valid UTF-8: `validate_name` refuses it, whole
        return name
    if len(encoded) <= MAX_NAME_BYTES:
        return name
    kept = encoded[:_KEPT_BYTES].decode("utf-8", "ignore")
    return f"{kept}~{hashlib.sha256(encoded).hexdigest()[:16]}"


def entry_label(key: object) -> str:
    """How errors name a `beat_schedule` entry: its key quoted, clipped (a key may be long)."""
    return f"beat_schedule[{shown(key)}]"


def zone_name(tz: tzinfo) -> str:
    """Return the IANA name of a Celery time zone; raise `ConfigError` if it has none."""
    key = getattr(tz, "key", None) or getattr(tz, "zone", None)
    if isinstance(key, str) and key:
        return key
    # Celery's host time (`enable_utc = False` and no `timezone`), which follows libc: its
    # offsets take no None (asked first, they raised AttributeError in a traceback).
    local = _local_zone_name() if type(tz).__name__ == "LocalTimezone" else None
    if local:
        return local
    if tz is timezone.utc or _is_utc(tz):
        return "UTC"
    raise ConfigError(
        f"time zone {shown(repr(tz))} has no IANA name; "
        "set app.conf.timezone = 'Europe/Paris' (say)"
    )


def _is_utc(tz: tzinfo) -> bool:
    try:
        return tz.utcoffset(None) == timedelta(0) and tz.tzname(None) == "UTC"
    except Exception:  # a tzinfo of its own that wants a datetime: not known as UTC
        return False


def _local_zone_name() -> str | None:
    """Return the host's IANA zone ($TZ, /etc/localtime, /etc/timezone), or None. A `$TZ` that
    is no IANA name (a POSIX rule such as `CET-1CEST,M3.5.0,M10.5.0/3`, a typo) raises
    `ConfigError`: libc, so Celery's local time, follows it, and /etc/localtime would then
    be another zone, silently."""
    given = os.environ.get("TZ", "").lstrip(":")
    if given:
        try:
            ZoneInfo(given)
        except (ValueError, KeyError, OSError):
            raise ConfigError(
                f"the host's time zone TZ={shown(given)} is not an IANA name, which emq-bridge "
                "needs for crontabs in Celery's local time (enable_utc = False); set "
                "app.conf.timezone = 'Europe/Paris' (say), or TZ to an IANA name"
            ) from None
        return given
    candidates: list[str] = []
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


def _defines(obj: object, method: str) -> bool:
    """True if `obj` has `method`, other than BaseSchedule's (which raises)."""
    found = getattr(type(obj), method, None)
    return callable(found) and found is not getattr(BaseSchedule, method)


def _check_schedule_value(value: Any, label: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise ConfigError(
            f"{label}: schedule {value!r} is not a schedule; use seconds, a timedelta, "
            "celery.schedules.schedule, crontab or solar"
        )


def _interval(value: timedelta, label: str) -> Every:
    """The cadence of a plain interval, on the grid; `ConfigError` unless at least 1 ms and
    within `Every`'s bound."""
    seconds = _checked_seconds(value, label)
    try:
        return _every(round(seconds * 1000))
    except ScheduleError as exc:
        raise ConfigError(f"{label}: {exc}") from exc


def _checked_seconds(value: timedelta, label: str) -> float:
    """The seconds of an interval; `ConfigError` unless at least 1 ms."""
    seconds = value.total_seconds()
    if seconds <= 0:
        raise ConfigError(f"{label}: the interval must be positive, got {seconds}s")
    if seconds * 1000 < 1:
        raise ConfigError(f"{label}: the interval must be at least 1 ms, got {seconds}s")
    return seconds


def convert_schedule(value: Any, app: Celery, label: str) -> Cadence:
    """Return the cadence of a Celery schedule (number, `timedelta`, `schedule`, `crontab`, ...)."""
    if type(value) is schedule and not value.relative and value.nowfun is None:
        return _interval(value.run_every, label)  # most entries: the checks below pass
    _check_schedule_value(value, label)
    if isinstance(value, (int, float, timedelta)):
        try:
            value = schedule(value, app=app)
        except (OverflowError, ValueError) as exc:  # past a timedelta's range, or NaN
            raise ConfigError(f"{label}: the interval {value!r} is not usable: {exc}") from exc
    if not (hasattr(value, "is_due") or hasattr(value, "remaining_estimate")):
        raise ConfigError(f"{label}: {value!r} is not a schedule (it has no is_due)")
    value.app = app
    # A schedule with a clock of its own (`nowfun`: a shifted or zoned `now`) is checked as
    # Celery's beat checks it, by that clock; a cron expression or an interval would drop it.
    own_clock = getattr(value, "nowfun", None) is not None
    if _plain(value, schedule, "is_due", "remaining_estimate"):
        if not value.relative and not own_clock:
            return _interval(value.run_every, label)
        # Checked as Celery checks it (below), but its interval as a plain one's: a negative
        # one would be due at every check, sent once a second.
        _checked_seconds(value.run_every, label)
    if _plain(value, crontab, "is_due", "remaining_estimate", "remaining_delta") and not own_clock:
        expr, day_and = crontab_expr(value)
        try:
            return Cron(expr, zone_name(value.tz), day_and)
        except EmqError as exc:
            raise ConfigError(f"{label}: crontab {value!r}: {exc}") from exc
    by_is_due = _defines(value, "is_due")  # Celery's beat only ever calls is_due
    if not (by_is_due or _defines(value, "remaining_estimate")):
        raise ConfigError(f"{label}: {value!r} defines neither is_due nor remaining_estimate")
    return CelerySchedule(value, _one_line(_ADDRESS.sub("", repr(value))), by_is_due)


# A `beat_schedule` of many entries holds a few intervals: each is built once (a frozen
# value), which also lets the cadence digest's cache find it by identity.
_EVERY: dict[int, Every] = {}
_EVERY_CACHED = 1024


def _every(every_ms: int) -> Every:
    found = _EVERY.get(every_ms)
    if found is None:
        found = Every(every_ms)
        if len(_EVERY) < _EVERY_CACHED:
            _EVERY[every_ms] = found
    return found


def own_tasks(app: Celery, declared: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The `(task, schedule)` pairs of `declared` (`@recurring`'s process-wide list) whose
    task is `app`'s own, proxies resolved; another app's task (or a shared copy) is left."""
    found = []
    tasks = app.tasks  # a cached property behind a lock: read once, not per declaration
    for given, declared_schedule in declared:
        task = given._get_current_object() if isinstance(given, Proxy) else given
        if tasks.get(task.name) is task:
            found.append((task, declared_schedule))
    return found


def json_options(options: Mapping[str, Any], label: str) -> dict[str, Any]:
    """Return `options` as JSON; `ConfigError` for what a template cannot hold or route.

    A kombu `Queue` under `queue` or `Exchange` under `exchange` (Celery's beat passes them
    to `apply_async` as they are) becomes its JSON description (`kombu_entities.entity_json`:
    name, exchange name and type, routing key, bindings, arguments, flags), which the
    dispatcher rebuilds at each send; one it cannot describe is refused, naming what.
    """
    if not options:  # most entries: nothing to check, nothing routes
        return {}
    out: dict[str, Any] = {}
    for key, given in options.items():
        if key == "task_id":
            raise ConfigError(f"{label}: options['task_id'] is set by emq-bridge")
        if key in POLICY_KEYS:
            raise ConfigError(
                f"{label}: {key!r} is a policy of the schedule, not a sending option: "
                "move it out of options (a key of the beat_schedule entry, an argument of "
                "@recurring)"
            )
        if isinstance(given, (Queue, Exchange)):
            out[key] = _entity_option(key, given, label)
            continue
        value = given
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
    unroutable = routing_option_error(out)
    if unroutable is not None:
        raise ConfigError(f"{label}: {unroutable}")
    return out


def _entity_option(key: str, given: Queue | Exchange, label: str) -> dict[str, Any]:
    """Return the description of the kombu object `given` as `options[key]`; `ConfigError`
    if `key` takes no such object or the object cannot be described."""
    kind = ENTITY_OPTIONS.get(key)
    if kind is None or not isinstance(given, kind):
        where = " or ".join(f"{cls.__name__} under {k!r}" for k, cls in ENTITY_OPTIONS.items())
        raise ConfigError(
            f"{label}: options[{key!r}] is a kombu {type(given).__name__}; Celery takes a "
            f"kombu {where}"
        )
    try:
        return entity_json(given)
    except ValueError as exc:
        raise ConfigError(f"{label}: options[{key!r}]: {exc}") from exc


@dataclass(slots=True)
class Entries:
    """What converting many entries of one app reads once: its settings, its tasks, and
    the queues its routing gave (when no `task_routes` can route on the arguments).

    `app_schedule` builds one per conversion of the `beat_schedule`, so the conf is read as
    it stands then; a lone `convert_entry` builds its own.
    """

    app: Celery
    check_task: bool = True
    tasks: Mapping[str, Any] = field(init=False)
    deadline: Any = field(init=False)
    # (task, the `queue` option) -> queue; None when a `task_routes` route may see the
    # arguments, so that each entry is routed on its own.
    queues: dict[tuple[str, Any], str] | None = field(init=False)

    def __post_init__(self) -> None:
        self.tasks = self.app.tasks
        self.deadline = self.app.conf.get("beat_cron_starting_deadline")
        self.queues = None if self.app.amqp.router.routes else {}

    def queue(self, task: str, options: Mapping[str, Any], args: Any, kwargs: Any) -> str:
        """Return `resolve_queue(...)` for the app, once per task and `queue` option when
        the routing depends on nothing else."""
        wanted = options.get("queue")
        if self.queues is None or not isinstance(wanted, str | None):
            return resolve_queue(self.app, task, options, args, kwargs)
        key = (task, wanted if "queue" in options else _NO_QUEUE)
        found = self.queues.get(key)
        if found is None:
            found = self.queues[key] = resolve_queue(self.app, task, options, args, kwargs)
        return found


_NO_BOUNDS = Bounds()  # frozen: one for every entry without bounds keys
_NO_QUEUE = object()  # an entry without a `queue` option (not one whose `queue` is None)
# Any `last_run_at`: the entry's own is Celery's beat state, which the registry does not
# take, and `ScheduleEntry` reads the clock (through the app's time zone) when none is given.
_NEVER_RAN = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _lazy_free(values: Iterable[Any], label: str) -> None:
    for value in values:
        if isinstance(value, BeatLazyFunc):
            raise ConfigError(f"{label}: BeatLazyFunc arguments are not supported; use values")


def _policies(raw: Mapping[str, Any], label: str) -> tuple[Overlap, int | None]:
    """Return the entry's `overlap` (default "allow") and `pause_after_failures` (default
    None); raise `ConfigError` if either is unusable."""
    overlap = raw.get("overlap", "allow")
    pause_after_failures = raw.get("pause_after_failures")
    try:
        check_policies(overlap, pause_after_failures)
    except EmqError as exc:
        raise ConfigError(f"{label}: {exc}") from exc
    return overlap, pause_after_failures


def _when(cadence: Cadence, when: Mapping[str, Any]) -> tuple[Cadence, Bounds]:
    """Apply an entry's bounds keys (`WHEN_KEYS`) to its cadence; `ScheduleError` if bad."""
    if not when:  # most entries
        return cadence, _NO_BOUNDS
    if "offset" in when:
        if not isinstance(cadence, Every):
            raise ScheduleError("offset applies to interval schedules only")
        offset = offset_ms(when["offset"], cadence.every_ms)
        cadence = Every(cadence.every_ms, cadence.anchor, offset)
    limit = when.get("limit")
    if when.get("one_off"):
        if limit not in (None, 1):
            raise ScheduleError("one_off is limit 1; give one of them")
        limit = 1
    bounds = Bounds(
        None if when.get("start_at") is None else epoch_ms(when["start_at"], "start_at", ceil=True),
        None if when.get("end_at") is None else epoch_ms(when["end_at"], "end_at"),
        limit,
        when.get("immediately", False),
    )
    return cadence, bounds


def _misfire(
    deadline: Any, raw: Mapping[str, Any], cadence: Cadence, label: str
) -> tuple[Misfire, int | None, int | None]:
    """Return the entry's misfire policy, catch-up window (ms) and `all`'s bound.

    A crontab entry without `catchup_window` takes Celery's `beat_cron_starting_deadline`
    (seconds): Celery's beat runs a missed crontab once, unless no slot falls within the
    deadline; that is `latest` with that window.
    """
    misfire = raw.get("misfire", "coalesce")
    try:
        window = catchup_window_ms(raw.get("catchup_window"))
        if window is None and deadline is not None and isinstance(cadence, Cron):
            window = catchup_window_ms(deadline)
        check_misfire(misfire, window, raw.get("catchup_max"))
    except EmqError as exc:
        raise ConfigError(f"{label}: {exc}") from exc
    return misfire, window, raw.get("catchup_max")


def _call_parts(
    args: Any, kwargs: Any, options: Any, label: str
) -> tuple[list[Any], dict[Any, Any], Mapping[str, Any]]:
    """Return an entry's args, kwargs and options as Celery sends them (empty for a false
    value, as `ScheduleEntry` stores them); `ConfigError` for what `apply_async` would refuse
    at every send (args not a list or tuple, kwargs or options not a mapping), rather than a
    string's characters taken for its args or a bare TypeError at boot."""
    args, kwargs, options = args or (), kwargs or {}, options or {}
    if not isinstance(args, list | tuple):
        raise ConfigError(f"{label}: 'args' must be a list or tuple, got {type(args).__name__}")
    for value, what in ((kwargs, "kwargs"), (options, "options")):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{label}: '{what}' must be a dict, got {type(value).__name__}")
    return list(args), dict(kwargs), options


def _task_template(
    task: str,
    args: list[Any],
    kwargs: dict[Any, Any],
    options: Mapping[str, Any],
    schedule: str | None = None,
) -> dict[str, Any]:
    """`TaskTemplate(task, args, kwargs, options).to_dict()`, whose checks these values pass
    (`_call_parts` made them a list and dicts): copies, as it makes them, since routing
    sees the entry's own `args` and `kwargs`; the dicts in them keep the entry's order.
    `schedule` names a custom Celery schedule (what the registry's readers show). The keys
    come in the order of their names, as `to_dict` writes them."""
    if schedule is None:
        return {"args": list(args), "kwargs": dict(kwargs), "options": dict(options), "task": task}
    return {
        "args": list(args),
        "kwargs": dict(kwargs),
        "options": dict(options),
        "schedule": schedule,
        "task": task,
    }


# The keys of a plain entry (`_convert_plain`): Celery's own that `ScheduleEntry` stores as
# given (`kwargs` and `options` or `{}`), and an interval.
_PLAIN_KEYS = frozenset(("task", "schedule", "args", "kwargs", "options"))


def _convert_plain(ctx: Entries, key: Any, raw: dict[str, Any]) -> Declaration | None:
    """Return the declaration of a plain entry as `convert_entry` makes it, without
    building Celery's `ScheduleEntry` and `schedule` (most of a large `beat_schedule`'s
    conversion went there); None for any other entry, or one `convert_entry` would refuse
    before its last steps: its own path then converts it, or raises its error.

    Plain: a dict of `_PLAIN_KEYS` alone (none of emq-bridge's keys: every policy and bound
    at its default) whose schedule is a `timedelta` or a number of seconds that `timedelta`
    takes (not a bool), whose key is a valid name as it is and whose task is known.
    `maybe_schedule` makes `schedule(timedelta(seconds=s))` of it, whose `run_every` is
    that timedelta and which `convert_schedule` reads as `_interval(run_every)`.
    """
    for field_name in raw:
        if field_name not in _PLAIN_KEYS:
            return None
    value: Any = raw.get("schedule")
    kind = type(value)
    if kind is timedelta:
        interval: timedelta = value
    elif kind is int or kind is float:  # not bool, None, schedule objects, crontab...
        try:
            interval = timedelta(seconds=value)
        except (OverflowError, ValueError):  # refused as Celery refuses it, on that path
            return None
    else:
        return None
    task = raw.get("task")
    if type(task) is not str or not task.strip() or (ctx.check_task and task not in ctx.tasks):
        return None
    if not task.isprintable():  # a control character: the slow path refuses it
        return None
    if type(key) is not str or len(key) > MAX_NAME_BYTES or not _ASCII_NAME.fullmatch(key):
        return None  # registry_name would change it, or refuse it
    label = f"beat_schedule[{key!r}]"
    args, kwargs, given = _call_parts(raw.get("args"), raw.get("kwargs"), raw.get("options"), label)
    for item in (*args, *kwargs.values()):
        if isinstance(item, BeatLazyFunc):
            return None
    options = json_options(given, label) if given else {}
    # `_interval`'s checks: an interval it refuses goes the slow path, which says so.
    seconds = interval.total_seconds()
    if seconds <= 0 or seconds * 1000 < 1 or round(seconds * 1000) > MAX_EVERY_MS:
        return None
    cadence = _every(round(seconds * 1000))
    template = _task_template(task, args, kwargs, options)
    try:
        definition = Definition(cadence, template, bounds=_NO_BOUNDS)
        return Declaration(ctx.queue(task, options, args, kwargs), key, definition)
    except EmqError as exc:
        raise ConfigError(f"beat_schedule[{key!r}]: {exc}") from exc


def convert_entry(
    app: Celery, key: str, raw: Any, *, check_task: bool = True, context: Entries | None = None
) -> tuple[Declaration, CelerySchedule | None]:
    """Return the declaration of one `beat_schedule` entry; raise `ConfigError` if it is bad.

    `context` (an `Entries`) carries what many conversions of one app share; given, its
    `check_task` is the one that applies.

    Besides Celery's keys, a dict entry may hold emq-bridge's `overlap` ("allow", "skip",
    "buffer_one", "replace"), `pause_after_failures` (a whole number, or None), `misfire`,
    `catchup_window` and `catchup_max` (docs/misfire.md), and the
    bounds `offset`, `start_at`, `end_at` (aware datetimes), `limit`, `one_off` and
    `immediately` (`WHEN_KEYS`); `at` (an aware datetime or a list) instead of `schedule` is
    a one-off; `labels` (a dict of str -> str) tags the registration.
    """
    ctx = context if context is not None else Entries(app, check_task)
    if type(raw) is dict:
        plain = _convert_plain(ctx, key, raw)
        if plain is not None:
            return plain, None
    label = entry_label(key)
    overlap: Overlap = "allow"
    pause_after_failures: int | None = None
    when: dict[str, Any] = {}
    labels: Any = None
    if isinstance(raw, ScheduleEntry):
        entry = raw
    elif type(raw) is dict or isinstance(raw, Mapping):
        if "schedule" in raw:  # maybe_schedule fails on a string with an AttributeError
            _check_schedule_value(raw["schedule"], label)
        overlap, pause_after_failures = _policies(raw, label)
        labels = raw.get(LABELS_KEY)
        when = {k: raw[k] for k in _WHEN_AND_AT if k in raw}
        if AT_KEY in raw and "schedule" in raw:
            raise ConfigError(f"{label}: give 'schedule' or 'at' (one-off instants), not both")
        celery_keys = {k: v for k, v in raw.items() if k not in _OWN_KEYS}
        try:
            celery_keys.setdefault("last_run_at", _NEVER_RAN)
            entry = ScheduleEntry(**dict(celery_keys, name=key, app=app))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"{label}: Celery rejects this entry: {exc}") from exc
    else:
        raise ConfigError(f"{label} must be a dict, got {type(raw).__name__}")
    task = entry.task
    if task is None or task == "":
        raise ConfigError(f"{label} has no 'task' (the name of the task to send)")
    if not isinstance(task, str):
        raise ConfigError(
            f"{label}: its 'task' must be a string (the name of the task to send), "
            f"got {type(task).__name__}"
        )
    try:
        check_task_name(task)
    except ScheduleError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if ctx.check_task and task not in ctx.tasks:
        raise ConfigError(
            f"{label}: unknown task {task!r}; import the module that defines it "
            "(app.conf.imports / include / autodiscover_tasks), or set "
            f"{setting_name(app, 'emq_bridge_check_tasks')} = False to send it by name"
        )
    args, kwargs, given = _call_parts(entry.args, entry.kwargs, entry.options, label)
    _lazy_free([*args, *kwargs.values()], label)
    options = json_options(given, label)
    if AT_KEY in when:
        try:
            cadence: Cadence = At(instants_ms(when[AT_KEY]))
        except ScheduleError as exc:
            raise ConfigError(f"{label}: {exc}") from exc
    else:
        cadence = convert_schedule(entry.schedule, app, label)
    policies = raw if isinstance(raw, Mapping) else {}
    misfire, window, most = _misfire(ctx.deadline, policies, cadence, label)
    custom = cadence if isinstance(cadence, CelerySchedule) else None
    name = registry_name(key)  # its error names the entry already
    try:
        if not task.strip():
            TaskTemplate(task)  # raises its error for a blank task name
        # A custom schedule is named in the template: what `emq-bridge list` shows.
        label_text = custom.describe() if custom is not None else None
        template = _task_template(task, args, kwargs, options, label_text)
        queue = ctx.queue(task, options, args, kwargs)
        if custom is not None:  # its log lines name the entry as the pump's do
            cadence = custom = replace(custom, entry=f"{queue}/{name}")
        cadence, bounds = _when(cadence, when)
        definition = Definition(
            cadence,
            template,
            misfire,
            overlap=overlap,
            pause_after_failures=pause_after_failures,
            bounds=bounds,
            catchup_window_ms=window,
            catchup_max=most,
            labels=labels if labels is not None else {},
        )
        declaration = Declaration(queue, name, definition)
    except EmqError as exc:
        raise ConfigError(f"{label}: {exc}") from exc
    return declaration, custom
