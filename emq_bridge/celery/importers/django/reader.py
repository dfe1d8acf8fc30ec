"""Read django-celery-beat's `PeriodicTask` rows into an `ImportPlan`.

Each row is carried as django-celery-beat's own scheduler (`ModelEntry`) would run it:
the options it sends (queue, exchange, routing_key, priority, expire_seconds, headers with
`periodic_task_name`), its next slot from `last_run_at` (never run: from `date_changed`;
with a `start_time`, not before it), `enabled=False` as a paused registration and
`total_run_count`/`last_run_at` as the registration's counters, a `start_time` as a start
bound (past or future: a re-import once it passed changes nothing) and `expires` as an end
bound (the last millisecond before it). One-offs become one-off registrations: a
`ClockedSchedule` its instant (`at`), a `one_off` interval or crontab its next slot with a
limit of one run. Solar schedules, and rows with nothing left to run (expired, a one-off
that ran, a disabled one-off: django-celery-beat disables a one-off once it ran and clears its
counters, so whether it ran is lost), are refused with the reason.

A naive datetime (a project with `USE_TZ = False` stores them) is read as django-celery-beat
reads it (its `utils.make_aware`): in the project's `TIME_ZONE`, or in UTC with `USE_TZ`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery import Celery
from celery.schedules import crontab, schedule

from ....cadence import At, Cron
from ....definition import Declaration, Definition
from ....errors import ConfigError, EmqError, ScheduleError
from ....keys import validate_name
from ....migrate.plan import Imported, ImportPlan, Refusal
from ....millis import floor_ms
from ....registry import Seed
from ....template import TaskTemplate, check_task_name
from ...entries import json_options, registry_name, resolve_queue
from ..redbeat import importer_app
from ..schedules import Carried, Unrepresentable, carry, epoch_ms

__all__ = ["DEFAULT_SOURCE", "read_periodic_tasks"]

DEFAULT_SOURCE = "import:django-celery-beat"
# The annotation that carries a crontab's zone as stored (`read_periodic_tasks`).
_ZONE = "emq_crontab_zone"
# What ModelEntry does to a never-run task with a start_time: its last run is this far back.
_NEVER_RAN_BEFORE_START = timedelta(days=365 * 30)


def read_periodic_tasks(
    *,
    now_ms: int,
    using: str = "default",
    queue: str = "celery",
    source: str = DEFAULT_SOURCE,
) -> ImportPlan:
    """Read every `PeriodicTask` of database alias `using` into a plan; nothing is written.

    `queue` is the queue of rows that name none (Celery's `task_default_queue`). Django
    must be set up (inside the project, or `standalone.setup`).
    """
    validate_name(queue, "queue")  # else every row naming none is refused, the rest written
    from django.db import Error as DatabaseError  # type: ignore[import-untyped]
    from django.db.models import CharField  # type: ignore[import-untyped]
    from django.db.models.functions import Cast  # type: ignore[import-untyped]
    from django_celery_beat.models import PeriodicTask  # type: ignore[import-untyped]

    apps: dict[str, Celery] = {}
    plan = ImportPlan(source)
    every_row = (
        PeriodicTask.objects.using(using)
        .select_related("interval", "crontab", "solar", "clocked")
        # A crontab's zone read as the text stored: its field's own reading raises while
        # the rows are read for a zone this machine does not know (a typo, an older
        # tzdata), which stopped every row's import; that row alone is refused.
        .defer("crontab__timezone")
        .annotate(**{_ZONE: Cast("crontab__timezone", CharField())})
        .order_by("name")
    )
    try:
        rows = list(every_row)
    except (DatabaseError, ValueError, TypeError, OverflowError) as exc:
        # A row the database driver or Django cannot read (a date of 30 February, a name
        # that is not UTF-8, in SQLite's loose columns): read row by row, that one refused.
        rows = _row_by_row(every_row, exc, plan, DatabaseError)
    for row in rows:
        origin = f"periodic task {row.name!r}"
        try:
            plan.entries.append(_entry(row, apps, now_ms, queue, source))
        except (Unrepresentable, EmqError) as exc:
            plan.refused.append(Refusal(origin, str(exc).removeprefix(f"{origin}: ")))
        # A row Celery refuses (a crontab never due), or a number no timedelta holds (an
        # interval of 2**31 - 1 days: OverflowError).
        except (ValueError, TypeError, OverflowError) as exc:
            plan.refused.append(Refusal(origin, f"Celery refuses it: {exc}"))
    return plan


def _row_by_row(
    every_row: Any, error: Exception, plan: ImportPlan, database_error: Any
) -> list[Any]:
    """The rows of `every_row` read one at a time, after reading them all at once failed
    with `error`; each row that cannot be read is refused in `plan`. A ConfigError when
    not even the rows' ids can be read (unreachable, no django-celery-beat tables)."""
    try:
        ids = list(every_row.values_list("pk", flat=True))
    except database_error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"cannot read django-celery-beat's periodic tasks ({type(error).__name__}: "
            f"{first}); is it the project's database, with django-celery-beat's migrations "
            "applied?"
        ) from None
    rows = []
    for ident in ids:
        try:
            rows.append(every_row.get(pk=ident))
        except (database_error, ValueError, TypeError, OverflowError) as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            plan.refused.append(
                Refusal(
                    _row_name(every_row, ident),
                    f"its row cannot be read ({type(exc).__name__}: {first})",
                )
            )
    return rows


def _row_name(every_row: Any, ident: Any) -> str:
    """How a refusal names the row `ident`: by its name when that can be read."""
    try:
        name = every_row.filter(pk=ident).values_list("name", flat=True).get()
    except Exception:  # the name is what cannot be read (not UTF-8): its id says which
        return f"periodic task with id {ident!r}"
    return f"periodic task {name!r}"


def _app(apps: dict[str, Celery], zone: str, queue: str) -> Celery:
    if zone not in apps:
        apps[zone] = importer_app(zone, queue)
    return apps[zone]


def _schedule(row: Any, apps: dict[str, Celery], queue: str) -> tuple[Any, Celery]:
    """Return the row's Celery schedule and the app (time zone) to convert it with."""
    if row.solar_id is not None:
        solar = row.solar
        if solar is None:
            raise Unrepresentable(f"its solar schedule (id {row.solar_id}) does not exist")
        where = f"{float(solar.latitude):g}, {float(solar.longitude):g}"
        raise Unrepresentable(
            f"solar {solar.event} at ({where}) is decided by Celery's is_due in the process "
            "that holds it: declare it in beat_schedule, "
            f"{{'task': {row.task!r}, 'schedule': solar({solar.event!r}, {where})}}"
        )
    if row.interval_id is not None:
        interval = row.interval
        if interval is None:  # SQLite keeps a foreign key to a row deleted by hand
            raise Unrepresentable(f"its interval (id {row.interval_id}) does not exist")
        app = _app(apps, "UTC", queue)
        return schedule(timedelta(**{interval.period: interval.every}), app=app), app
    if row.crontab_id is not None:
        c = row.crontab
        if c is None:
            raise Unrepresentable(f"its crontab (id {row.crontab_id}) does not exist")
        zone = getattr(row, _ZONE)
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            raise Unrepresentable(
                f"its crontab's timezone {zone!r} is not a time zone this machine knows "
                "(an IANA name, from tzdata)"
            ) from None
        app = _app(apps, zone, queue)
        value = crontab(
            minute=c.minute,
            hour=c.hour,
            day_of_week=c.day_of_week,
            day_of_month=c.day_of_month,
            month_of_year=c.month_of_year,
            app=app,
        )
        return value, app
    raise Unrepresentable("it has no schedule (interval, crontab, solar or clocked)")


def _carried(
    row: Any, apps: dict[str, Celery], now_ms: int, queue: str, label: str
) -> tuple[Carried, Celery]:
    """Return the row's schedule carried over: a ClockedSchedule as a one-off instant, a
    one-off interval or crontab as its next slot with a limit of one run."""
    if row.clocked_id is not None and row.clocked is None:  # a row deleted by hand (SQLite)
        raise Unrepresentable(f"its clocked schedule (id {row.clocked_id}) does not exist")
    if row.one_off:
        _refuse_if_ran(row, now_ms)
    if row.clocked_id is not None:
        at_ms = epoch_ms(_aware(row.clocked.clocked_time, "its clocked time"))
        # Due once its time has come, as ClockedSchedule.is_due: a past one fires at once.
        return Carried(At((at_ms,)), at_ms), _app(apps, "UTC", queue)
    value, app = _schedule(row, apps, queue)
    carried = carry(value, app, label, last_run_ms=_last_run_ms(row, now_ms), now_ms=now_ms)
    if row.one_off:
        carried = replace(carried, limit=1)
    return carried, app


def _refuse_if_ran(row: Any, now_ms: int) -> None:
    """Refuse a one-off that ran, or may have: importing it would fire it a second time."""
    if row.total_run_count or row.last_run_at is not None:
        when = (
            f" (last at {_aware(row.last_run_at, 'its last_run_at').isoformat()})"
            if row.last_run_at
            else ""
        )
        raise Unrepresentable(f"a one-off that already ran{when}: nothing left to fire")
    if row.enabled:
        return
    # Once a one-off ran, django-celery-beat sets enabled=False and total_run_count=0, and its
    # save() clears last_run_at: the row is then one disabled before it ran. Only a clocked
    # time still ahead says it has not run (it runs at that time, not before).
    if (
        row.clocked_id is not None
        and epoch_ms(_aware(row.clocked.clocked_time, "its clocked time")) > now_ms
    ):
        return
    raise Unrepresentable(
        "a disabled one-off: django-celery-beat disables a one-off once it ran (clearing its "
        "run count and last run), so it may have run and is not imported, never to fire "
        "twice; create it again if it is still to run"
    )


def _entry(row: Any, apps: dict[str, Celery], now_ms: int, queue: str, source: str) -> Imported:
    label = f"periodic task {row.name!r}"
    if not isinstance(row.name, str):  # SQLite's loose columns: bytes that are not UTF-8
        raise Unrepresentable("its name is not text (UTF-8)")
    try:
        check_task_name(row.task)
    except ScheduleError as exc:
        raise Unrepresentable(f"its task: {exc}") from None
    end_ms = None
    expires = _aware(row.expires, "its expires") if row.expires is not None else None
    if expires is not None:
        if epoch_ms(expires) <= now_ms:
            raise Unrepresentable(
                f"expired at {expires.isoformat()}: django-celery-beat never runs it again"
            )
        end_ms = epoch_ms(expires) - 1  # it runs while now < expires
    carried, app = _carried(row, apps, now_ms, queue, label)
    try:
        args = json.loads(row.args or "[]")
        kwargs = json.loads(row.kwargs or "{}")
        headers = json.loads(row.headers or "{}")
    except ValueError as exc:
        raise Unrepresentable(f"its args, kwargs or headers are not JSON: {exc}") from exc
    except RecursionError:
        raise Unrepresentable("its args, kwargs or headers are nested too deep") from None
    # JSON null: django-celery-beat sends it as None, which Celery sends as no arguments.
    args, kwargs, headers = (
        empty if value is None else value
        for value, empty in ((args, []), (kwargs, {}), (headers, {}))
    )
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(headers, dict):
        raise Unrepresentable("args must be a JSON array, kwargs and headers JSON objects")
    raw_options: dict[str, Any] = {
        k: getattr(row, k)
        for k in ("queue", "exchange", "routing_key", "priority")
        if getattr(row, k) is not None
    }
    if row.expire_seconds:
        raw_options["expires"] = row.expire_seconds
    elif expires is not None:  # ModelEntry sends it as the task's expiry too
        # In UTC: the same instant read under `USE_TZ = False` (the project's zone) would
        # otherwise be another text, and a re-import an update.
        raw_options["expires"] = expires.astimezone(timezone.utc).isoformat()
    raw_options["headers"] = {**headers, "periodic_task_name": row.name}
    options = json_options(raw_options, label)
    first_run_ms, rhythm_ms, start_ms = carried.first_run_ms, carried.rhythm_ms, None
    if row.start_time is not None:
        # Kept once it passed too: a bound that went away when the start passed made the next
        # re-import an update, which fired the start slot a second time.
        start_ms = epoch_ms(_aware(row.start_time, "its start_time"))
        if isinstance(carried.cadence, Cron) and start_ms > now_ms:
            # Not the start itself, which is no slot of it: its first slot from then on, as
            # django-celery-beat waits for (`PeriodicTask.due_start_time`). (Once the start
            # passed, its crontab's `is_due` from the last run decides, as `carry` does.)
            first_run_ms = carried.cadence.next_after(start_ms)  # after it, as the peer
        first_run_ms = max(first_run_ms, start_ms)
        rhythm_ms = None if rhythm_ms is None else max(rhythm_ms, start_ms)
    if expires is not None and end_ms is not None and first_run_ms > end_ms:
        raise Unrepresentable(
            f"its next run comes after it expires ({expires.isoformat()}): nothing left to fire"
        )
    template = TaskTemplate(row.task, args, kwargs, options).to_dict()
    definition = Definition(carried.cadence, template, bounds=carried.bounds(start_ms, end_ms))
    declaration = Declaration(
        resolve_queue(app, row.task, options, args, kwargs),
        registry_name(row.name, "its name"),
        definition,
    )
    seed = Seed(
        first_run_ms,
        paused=not row.enabled,
        fired=max(int(row.total_run_count or 0), 0),
        last_fired_ms=epoch_ms(_aware(row.last_run_at, "its last_run_at"))
        if row.last_run_at is not None
        else None,
        rhythm_ms=rhythm_ms,
    )
    return Imported(label, declaration, seed)


def _last_run_ms(row: Any, now_ms: int) -> int:
    """Return the last run ModelEntry computes from: `last_run_at`, else `date_changed`
    (30 years earlier with a `start_time`, so it fires at the start), else now."""
    if row.last_run_at is not None:
        return epoch_ms(_aware(row.last_run_at, "its last_run_at"))
    changed: datetime | None = row.date_changed
    base = epoch_ms(_aware(changed, "its date_changed")) if changed is not None else now_ms
    if row.start_time is not None:
        base -= floor_ms(_NEVER_RAN_BEFORE_START)
    return base


def _aware(value: datetime, what: str) -> datetime:
    """Return `value` with its time zone: a naive one as django-celery-beat's `make_aware`
    reads it, in the project's `TIME_ZONE` when `USE_TZ` is False, else in UTC. A value
    that is no date (SQLite keeps any text in a date column; Django reads an unreadable
    one as None) is refused, as `what`."""
    if not isinstance(value, datetime):
        raise Unrepresentable(f"{what} is not a date")
    if value.utcoffset() is not None:
        return value
    from django.conf import settings  # type: ignore[import-untyped]
    from django.utils.timezone import get_default_timezone  # type: ignore[import-untyped]

    zone = timezone.utc if settings.USE_TZ else get_default_timezone()
    return value.replace(tzinfo=zone)
