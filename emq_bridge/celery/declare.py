"""The Celery app's declared schedules: settings, `@recurring`, `beat_schedule`, boot sync.

Part of `emq_bridge.celery`, which re-exports the public names.

Ownership: `beat_schedule` belongs to the beat, the process that runs it, and only its sync
removes an entry the app no longer declares (under `celery.<main>`, `emq_bridge_source`). The
`@recurring` tasks go under `celery.<main>.recurring`, which the beat and every worker sync at
start, each removing the schedules of the tasks it knows and no longer declares (a task it
does not import is not one it can tell was dropped). A worker never syncs `beat_schedule`, so
one whose config is older, or has no `beat_schedule`, cannot delete the beat's entries or
revert them; with `emq_bridge_generation` an older worker or beat writes nothing at all.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from celery import Celery, Task
from celery.local import Proxy
from celery.schedules import crontab
from celery.signals import celeryd_after_setup
from kombu.entity import Exchange, Queue

from ..bounds import Instant
from ..bulk import without_gc
from ..cadence import Anchor, Cadence, Misfire
from ..calendars import ExcludeItem
from ..definition import Declaration, Offset, Overlap, Schedule, naming_schedule
from ..errors import ConfigError, EmqError, ScheduleError
from ..file_stamp import FileStamp, file_fingerprint, file_stamp
from ..keys import DEFAULT_PREFIX, validate_name
from ..registry import Repeat, generation_arg
from ..shown import shown
from ..sync import Stamp, SyncPlan, check_one_source, moves_of, queues_of, stamped, sync
from ..template import TaskTemplate
from ..urls import check_tls_options, redact_url, tls_url, url_has_password
from .dispatch import arguments_refused
from .entries import (
    PLACEHOLDER,
    CelerySchedule,
    Entries,
    convert_entry,
    json_options,
    own_tasks,
    registry_name,
    zone_name,
)
from .fingerprint import app_fingerprint
from .setting_names import setting_hint, setting_name, warn_unread_settings

__all__ = [
    "AppSchedule",
    "app_schedule",
    "boot_schedule",
    "boot_sources",
    "number_text",
    "recurring",
    "registry_prefix",
    "registry_tls",
    "registry_url",
    "repeat_for",
    "shown_registry_url",
    "sync_app",
]

log = logging.getLogger("emq_bridge.celery")

T = TypeVar("T")

# What `tasks_source` appends to the app's source.
TASKS_SOURCE_SUFFIX = ".recurring"

# -- settings ---------------------------------------------------------------------------


def _setting(app: Celery, name: str, default: Any = None) -> Any:
    value = app.conf.get(name)
    return default if value is None else value


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def flag_setting(app: Celery, name: str, default: bool) -> bool:
    """Return the boolean setting `name`: True/False, or the strings settings read from the
    environment hold ("true"/"false", "1"/"0", "yes"/"no", "on"/"off", any case), so that
    `"false"` is never read as true; `ConfigError` naming it for anything else."""
    value = _setting(app, name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    raise ConfigError(
        f"{setting_name(app, name)} must be True or False (or one of the strings true/false, "
        f"1/0, yes/no, on/off), got {value!r}"
    )


# A number as text: plain decimal digits, an optional sign and fraction (no exponent, no
# `_` separators, no digits of other scripts, which `int()` and `float()` would take).
_WHOLE_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def number_text(value: Any, *, whole: bool = False) -> Any:
    """A number given as text, as a settings module read from the environment holds it
    (`"10"`; `"2.5"` unless `whole`), as that number; anything else as it is, for the
    caller's check to name as given. So `CELERY_EMQ_BRIDGE_GENERATION = os.environ["BUILD"]`
    is the build's number."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if _WHOLE_TEXT.fullmatch(text):
        return int(text)
    if not whole and _DECIMAL_TEXT.fullmatch(text):
        return float(text)
    return value


def registry_url(app: Celery) -> str:
    """Return the registry's Redis URL: `emq_bridge_redis_url`, else a Redis broker URL."""
    url = _setting(app, "emq_bridge_redis_url")
    if url:
        return str(url)
    broker = app.conf.broker_write_url or app.conf.broker_url
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else None
    if isinstance(broker, str):
        first = broker.split(";")[0].strip()
        scheme, _, rest = first.partition("://")
        if scheme.lower() in ("redis", "rediss"):
            return first
        if scheme.lower() in ("redis+socket", "socket"):
            return f"unix://{rest}"
        if scheme.lower() == "sentinel":
            raise ConfigError(
                "emq-bridge does not take its registry from a sentinel:// broker URL (its "
                "master is named in broker_transport_options): "
                + setting_hint(
                    app, "emq_bridge_redis_url", "'redis+sentinel://host:26379/MASTER_NAME/0'"
                )
            )
    raise ConfigError(
        "emq-bridge needs a Redis for its registry: "
        + setting_hint(app, "emq_bridge_redis_url", "'redis://host:6379/0'")
        + " (it defaults to the broker URL only when the broker is Redis)"
    )


def shown_registry_url(app: Celery) -> str:
    """Return the registry's URL as its client connects, for logs and the beat's banner:
    `rediss://` when a TLS setting makes a `redis://` one speak TLS (`registry_tls`), its
    password redacted. `ConfigError` as `registry_url`."""
    url = registry_url(app)
    try:
        if registry_tls(app) is not None:
            url = tls_url(url)
    except ConfigError:
        pass  # the client's setup says why; the URL as given names the server
    # Ours, not kombu's maybe_sanitize_url: that one fails on a multi-host (Sentinel,
    # Cluster) URL, and does not know a password may hold '/', '#', '?'.
    return redact_url(url)


# The registry's own TLS setting, as Celery names its result backend's (`redis_backend_use_ssl`).
TLS_SETTING = "emq_bridge_redis_use_ssl"


def registry_tls(app: Celery) -> tuple[str, dict[str, Any]] | None:
    """Return the TLS options of the registry's client, with the setting that gave them:
    `emq_bridge_redis_use_ssl`, else `broker_use_ssl` when the registry is the broker's
    Redis (no `emq_bridge_redis_url`), as Celery's Redis transport reads it. None when
    neither asks for TLS: the URL alone decides (a `rediss://` one speaks it, with redis-py's
    defaults).

    Either setting is what Celery takes: a dict of redis-py's `ssl_*` options
    (`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs` ...), True for TLS with
    the defaults, False or an empty dict for none. `ConfigError` naming it for anything else.
    """
    own = app.conf.get(TLS_SETTING)
    if own is not None:
        return _tls_setting(TLS_SETTING, own)
    if _setting(app, "emq_bridge_redis_url"):
        return None  # a registry of its own: the broker's TLS is the broker's
    return _tls_setting("broker_use_ssl", app.conf.get("broker_use_ssl"))


def _tls_setting(name: str, value: Any) -> tuple[str, dict[str, Any]] | None:
    """The TLS options the setting `name` holds (see `registry_tls`), keys checked."""
    if value is True:
        return name, {}
    if value is None or value is False:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name} must be a dict of redis-py's ssl_* options, True or False, "
            f"got {type(value).__name__}"
        )
    if not value:
        return None  # falsy, as Celery reads it: no TLS
    return name, dict(value)


def _tls_client(url: str, tls: tuple[str, dict[str, Any]] | None) -> tuple[str, dict[str, Any]]:
    """Return the registry's URL on TLS and the TLS options (`registry_tls`) its client
    takes, checked before anything connects; `ConfigError` naming the setting if they are
    not ones redis-py takes. No TLS asked for: the URL as given, no options."""
    if tls is None:
        return url, {}
    name, options = tls
    try:
        secure = tls_url(url)
        check_tls_options(secure, options)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return secure, options


def registry_prefix(app: Celery) -> str:
    """Return the registry's key prefix: `emq_bridge_prefix`, default `"emq"`."""
    return str(_setting(app, "emq_bridge_prefix", DEFAULT_PREFIX))


def repeat_for(app: Celery, **options: Any) -> Repeat:
    """Return a `Repeat` on the app's registry (`registry_url`, `emq_bridge_prefix`), on TLS
    as `registry_tls` says.

    `options` go to the client (`Repeat.from_url`), over the TLS options and the default
    timeouts.
    """
    warn_unread_settings(app)  # a misspelt setting would otherwise pass unseen
    url, tls = _tls_client(registry_url(app), registry_tls(app))
    # Timeouts, so a Redis that hangs surfaces as RegistryUnavailable instead of a stuck beat.
    options = {
        "socket_connect_timeout": 10,
        "socket_timeout": 30,
        **registry_password(app, url),
        **tls,
        **options,
    }
    return Repeat.from_url(url, registry_prefix(app), **options)


def registry_password(app: Celery, url: str) -> dict[str, str]:
    """`{"password": emq_bridge_redis_password}` when it is set, else `{}`. Celery hides a
    setting whose name holds PASS from `celery report`, `inspect conf` and Flower, not
    `emq_bridge_redis_url` (its name matches none of its patterns): the password kept here,
    out of the URL, is shown masked. `ConfigError` if it is not a non-empty string, or if
    the URL holds a password too (the URL's would win, silently)."""
    password = app.conf.get("emq_bridge_redis_password")
    if password is None:
        return {}
    if not isinstance(password, str) or not password:
        raise ConfigError(
            f"{setting_name(app, 'emq_bridge_redis_password')} must be a non-empty string"
        )
    if url_has_password(url):
        name = setting_name(app, "emq_bridge_redis_password")
        raise ConfigError(
            f"{name} is set and the registry URL holds a password too: "
            f"keep it in one place ({name}, which celery report masks)"
        )
    return {"password": password}


def _source(app: Celery) -> str:
    source = str(_setting(app, "emq_bridge_source", f"celery.{app.main or 'app'}"))
    try:
        validate_name(tasks_source(source), "source")  # the longer of the two
        return validate_name(source, "source")
    except EmqError as exc:
        raise ConfigError(
            f"{setting_name(app, 'emq_bridge_source')}: {exc}; "
            + setting_hint(app, "emq_bridge_source", "'<a valid source name>'")
        ) from exc


def tasks_source(source: str) -> str:
    """The source of an app's `@recurring` tasks, beside `source`, its `beat_schedule`'s: the
    beat prunes the first only of the tasks it knows, the second of all it no longer has."""
    return f"{source}{TASKS_SOURCE_SUFFIX}"


def _generation(app: Celery) -> int | None:
    """Return `emq_bridge_generation`: the declarations' generation, raised by each deploy."""
    value = number_text(app.conf.get("emq_bridge_generation"), whole=True)
    if isinstance(value, str):  # text that is no whole number: quoted as given
        raise ConfigError(
            f"{setting_name(app, 'emq_bridge_generation')}: generation must be a whole "
            f"number, got {shown(value)}"
        )
    try:
        generation_arg(value, "emq_bridge_source")  # any source: only the value is checked
    except ConfigError as exc:
        raise ConfigError(f"{setting_name(app, 'emq_bridge_generation')}: {exc}") from exc
    return None if value is None else int(value)


# -- declarations -----------------------------------------------------------------------


# A `beat_schedule`'s refusal names this many bad entries, then how many more: one line, as
# a schedule file's (`config.MAX_ERRORS_SHOWN`).
_ERRORS_SHOWN = 20

# What `@recurring` declared: (the task, its schedule), in decoration order.
_DECLARED: list[tuple[Any, Schedule]] = []


def recurring(
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: float | timedelta | str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    options: Mapping[str, Any] | None = None,
    anchor: Anchor = "grid",
    misfire: Misfire = "coalesce",
    overlap: Overlap = "allow",
    pause_after_failures: int | None = None,
    catchup_window: float | timedelta | str | None = None,
    catchup_max: int | None = None,
    offset: Offset | None = None,
    at: Instant | Sequence[Instant] | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    limit: int | None = None,
    immediately: bool = False,
    jitter: float | timedelta | str | None = None,
    exclude: Sequence[ExcludeItem] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Callable[[T], T]:
    """Declare a recurring Celery task; stack it above `@app.task`.

    `cron` is read in `tz`, default the app's `timezone`; `every` is seconds, a `timedelta` or
    `"15m"`. The schedule is synced when a worker or beat of the app starts; `name` defaults
    to the task name, the queue to the task's routing. `overlap` is what a slot does while a
    run is in flight ("allow", "skip", "buffer_one", "replace"); `pause_after_failures`
    pauses the schedule after that many consecutive failed runs. Both need the workers to
    report (`emq_bridge_report`, on by default). `misfire` ("latest", "earliest", "skip",
    "all"), `catchup_window` and `catchup_max` say what fires after an outage
    (docs/misfire.md); `jitter` and `exclude` spread and skip slots (docs/cron.md);
    `labels` (str -> str) tag the registration (docs/schedules-and-cli.md). Bad values
    raise `ScheduleError` here (before the task is known: with a `name`, the error says
    `schedule 'name': ...`).
    """
    with naming_schedule(name):
        args, kwargs, options = _call_parts(args, kwargs, options)
        if any(isinstance(value, Queue | Exchange) for value in options.values()):
            try:  # described as a beat_schedule entry's are (the template is JSON)
                options = json_options(options, "options")
            except ConfigError as exc:
                raise ScheduleError(str(exc)) from None
        schedule = Schedule(
            every=every,
            cron=cron,
            tz=tz,
            args=args,
            kwargs=kwargs,
            options=options,
            name=name,
            anchor=anchor,
            misfire=misfire,
            overlap=overlap,
            pause_after_failures=pause_after_failures,
            catchup_window=catchup_window,
            catchup_max=catchup_max,
            offset=offset,
            at=at,
            start_at=start_at,
            end_at=end_at,
            limit=limit,
            immediately=immediately,
            jitter=jitter,
            exclude=exclude,
            labels=labels,
        )

    def wrap(task: T) -> T:
        if not isinstance(task, (Proxy, Task)):
            raise ConfigError("@recurring goes above @app.task: it decorates a task")
        _DECLARED.append((task, schedule))
        return task

    return wrap


def _call_parts(
    args: Sequence[Any], kwargs: Mapping[str, Any] | None, options: Mapping[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """Return `@recurring`'s args, kwargs and options as its schedule keeps them (copies);
    raise `ScheduleError` unless they are a sequence and mappings, as a template checks them
    (`tuple("abc")` would be three arguments, `dict([1])` a `TypeError`)."""
    kwargs, options = {} if kwargs is None else kwargs, {} if options is None else options
    TaskTemplate("@recurring", args, kwargs, options)  # checks the types only
    return tuple(args), dict(kwargs), dict(options)


def _decorated(app: Celery, context: Entries) -> list[Declaration]:
    """The app's `@recurring` declarations; `context` routes them (once per task and
    `queue` option, as it does the `beat_schedule` entries)."""
    found = []
    for task, schedule in own_tasks(app, _DECLARED):
        label = f"@recurring on {task.name}"
        # The task is in hand: args it refuses are said now, not parked at the first send
        # (a daily schedule's, a day later).
        refused = arguments_refused(task, schedule.args, schedule.kwargs or {})
        if refused is not None:
            raise ConfigError(f"{label}: {refused}")
        try:
            options = json_options(schedule.options or {}, label)
            # `replace` checks the schedule again (a `define`): only when an option changed.
            bound = schedule if options == schedule.options else replace(schedule, options=options)
            queue = context.queue(task.name, options, schedule.args, schedule.kwargs)
            zone = zone_name(app.timezone) if schedule.cron is not None else None
            found.append(bound.bind(task.name, queue, default_tz=zone))
        except EmqError as exc:
            raise ConfigError(f"{label}: {exc}") from exc
    return found


@dataclass(frozen=True, slots=True)
class AppSchedule:
    """What an app declares, at `generation`: `beat_schedule` entries (`entries`, synced under
    `source`), then `@recurring` tasks (`tasks`, under `tasks_source`), together
    `declarations`, what the beat syncs; a worker syncs the `tasks`."""

    source: str
    declarations: tuple[Declaration, ...]
    custom: Mapping[tuple[str, str], CelerySchedule]
    queues: tuple[str, ...]
    extra: tuple[Any, ...] = field(default=())  # schedule files: (source, declarations)
    tasks: tuple[Declaration, ...] = field(default=())
    generation: int | None = None
    # A boot that found its stamp (`boot_schedule`) builds no declarations: how many the
    # stamp vouches for.
    vouched: int | None = None
    # The plans `boot_schedule` applied (none for a source whose stamp held).
    synced: tuple[SyncPlan, ...] = ()

    @property
    def count(self) -> int:
        """How many schedules the app declares (a schedule file's not included)."""
        return len(self.declarations) if self.vouched is None else self.vouched

    @property
    def tasks_source(self) -> str:
        """The source the `@recurring` tasks are synced under."""
        return tasks_source(self.source)

    @property
    def entries(self) -> tuple[Declaration, ...]:
        """The `beat_schedule` entries: `declarations` but the `tasks`, which come last."""
        return self.declarations[: len(self.declarations) - len(self.tasks)]

    def resolve_cadence(self, queue: str, name: str, stored: Cadence) -> Cadence:
        """Return the live schedule of a custom entry whose record holds its placeholder
        (a `CelerySchedule`, checked through `is_due`), else the stored cadence."""
        live = self.custom.get((queue, name))
        if live is None or stored != PLACEHOLDER:
            return stored  # not ours, or since given a real cadence by another writer
        return live


def _beat_entries(app: Celery) -> dict[str, Any]:
    schedule = app.conf.beat_schedule or {}
    if not isinstance(schedule, Mapping):  # a list of entries, say: said, not a dict() error
        raise ConfigError(
            f"beat_schedule must be a dict of entries by name, got a {type(schedule).__name__}"
        )
    entries = dict(schedule)
    # Celery's beat installs this one too (see Scheduler.install_default_entries).
    if app.conf.result_expires and not app.backend.supports_autoexpire:
        entries.setdefault(
            "celery.backend_cleanup",
            {
                "task": "celery.backend_cleanup",
                "schedule": _crontab_4am(),
                "options": {"expires": 12 * 3600},
            },
        )
    return entries


def _crontab_4am() -> Any:
    return crontab("0", "4", "*")


def _schedule_files(app: Celery) -> tuple[tuple[str, tuple[Declaration, ...]], ...]:
    """The schedule file's `(source, declarations)`, if the app names one."""
    path = _setting(app, "emq_bridge_schedule_file")
    if not path:
        return ()
    from ..config import load_schedule_file  # lazily: only apps that name a file need it

    loaded = load_schedule_file(str(path))
    return ((loaded.source, tuple(loaded.declarations)),)


def _app_queues(app: Celery, declarations: Sequence[Declaration]) -> set[str]:
    """The queues the beat pumps for the app's own declarations and settings."""
    queues = {d.queue for d in declarations} | {app.conf.task_default_queue}
    queues |= {q.name for q in (app.conf.task_queues or ()) if hasattr(q, "name")}
    queues |= set(_extra_queues(app))
    return queues


def _extra_queues(app: Celery) -> tuple[str, ...]:
    """`emq_bridge_queues`, checked: a list of queue names (a string would be one queue a
    letter); `ConfigError` before anything is written."""
    raw = _setting(app, "emq_bridge_queues", ())
    if isinstance(raw, str | bytes) or not isinstance(raw, list | tuple | set | frozenset):
        raise ConfigError(
            f"{setting_name(app, 'emq_bridge_queues')} must be a list of queue names, got "
            + type(raw).__name__
            + (f" {raw!r:.80}" if isinstance(raw, str) else "")
        )
    try:
        return tuple(validate_name(q, "queue") for q in raw)
    except EmqError as exc:
        raise ConfigError(f"{setting_name(app, 'emq_bridge_queues')}: {exc}") from None


def _file_queues(extra: Sequence[tuple[str, tuple[Declaration, ...]]]) -> set[str]:
    return {d.queue for _, decls in extra for d in decls}


@without_gc
def app_schedule(app: Celery) -> AppSchedule:
    """Validate and convert everything the app declares; raise `ConfigError`, write nothing."""
    return _app_schedule(app, _schedule_files(app))


def _app_schedule(
    app: Celery,
    extra: tuple[tuple[str, tuple[Declaration, ...]], ...],
    entries: Mapping[str, Any] | None = None,
) -> AppSchedule:
    """`app_schedule`, with the schedule files' declarations given (`extra`), and the
    `beat_schedule` entries when the caller read them (`_beat_entries`)."""
    check = flag_setting(app, "emq_bridge_check_tasks", True)
    declarations: list[Declaration] = []
    custom: dict[tuple[str, str], CelerySchedule] = {}
    context = Entries(app, check)  # the conf, tasks and routing, read once for all entries
    # Every bad entry is named, as a schedule file's are: the first refusal, the messages
    # shown (not each exception, whose traceback holds its frames) and how many in all.
    first: ConfigError | None = None
    refused: list[str] = []
    count = 0
    for key, raw in (_beat_entries(app) if entries is None else entries).items():
        try:
            declaration, live = convert_entry(app, key, raw, context=context)
        except ConfigError as exc:
            first, count = first or exc, count + 1
            if count <= _ERRORS_SHOWN:
                refused.append(str(exc))
            continue
        declarations.append(declaration)
        if live is not None:
            custom[(declaration.queue, declaration.name)] = live
    if first is not None:
        _refuse_entries(first, refused, count)
    tasks = _decorated(app, context)
    _check_not_declared_twice(declarations, tasks)
    source = _source(app)
    if extra:  # the app's two sources cannot clash: checked above
        check_one_source([(source, declarations), (tasks_source(source), tasks), *extra])
    declarations.extend(tasks)
    return AppSchedule(
        source,
        tuple(declarations),
        custom,
        tuple(sorted(_app_queues(app, declarations) | _file_queues(extra))),
        extra,
        tasks=tuple(tasks),
        generation=_generation(app),
    )


def _refuse_entries(first: ConfigError, shown: list[str], count: int) -> NoReturn:
    """Raise the one `ConfigError` of the `count` `beat_schedule` entries `convert_entry`
    refused: the messages `shown` (the first `_ERRORS_SHOWN`, each naming its entry) in one
    line, then how many more; a lone refusal (`first`) as it was raised."""
    if count == 1:
        raise first
    if count > len(shown):
        shown.append(f"and {count - len(shown)} more")
    raise ConfigError("; ".join(shown)) from first


def _check_not_declared_twice(entries: Sequence[Declaration], tasks: Sequence[Declaration]) -> None:
    """Raise `ConfigError` when a `@recurring` task is the registration of a `beat_schedule`
    entry too (same queue and name): the two sources would take it from each other."""
    if not entries or not tasks:
        return
    keys = {(d.queue, d.name) for d in entries}
    for task in tasks:
        if (task.queue, task.name) in keys:
            raise ConfigError(
                f"schedule {task.queue}/{task.name} is declared twice: by a beat_schedule "
                "entry and by a @recurring task; rename one of them"
            )


@without_gc
def decorated_schedule(app: Celery) -> AppSchedule:
    """Validate and convert the app's `@recurring` tasks alone: what a worker syncs (its
    `beat_schedule` belongs to the beat, so a worker converts only the entries whose name
    one of its tasks takes, to refuse a task the beat would refuse as declared twice)."""
    check = flag_setting(app, "emq_bridge_check_tasks", True)
    context = Entries(app, check)
    tasks = tuple(_decorated(app, context))
    _check_not_in_beat_schedule(app, tasks, context)
    return AppSchedule(
        _source(app),
        tasks,
        {},
        tuple(sorted(_app_queues(app, tasks))),
        tasks=tasks,
        generation=_generation(app),
    )


def _check_not_in_beat_schedule(
    app: Celery, tasks: Sequence[Declaration], context: Entries
) -> None:
    """Raise `ConfigError` when a `@recurring` task is the registration of a `beat_schedule`
    entry too: the beat refuses that app ("declared twice"), and a worker's boot would
    otherwise rewrite the beat's schedule with its task's before any beat said so."""
    entries = _beat_entries(app)
    if not entries or not tasks:
        return
    keys: dict[str, list[str]] = {}
    for key in entries:
        try:
            keys.setdefault(registry_name(key), []).append(key)
        except EmqError:
            continue  # a bad key is the beat's to refuse
    for task in tasks:
        for key in keys.get(task.name, ()):
            try:
                entry, _ = convert_entry(app, key, entries[key], context=context)
            except EmqError:
                continue
            if (entry.queue, entry.name) == (task.queue, task.name):
                raise ConfigError(
                    f"schedule {task.queue}/{task.name} is declared twice: by beat_schedule "
                    f"entry {key!r} and by a @recurring task; rename one of them (the beat "
                    "refuses this app too)"
                )


@without_gc
def boot_schedule(app: Celery, repeat: Repeat) -> AppSchedule:
    """Validate, convert and sync what the app declares, as its beat does when it starts
    (`sync_app`), stamping each sync: the app's two with its fingerprint (`app_fingerprint`),
    the schedule file's with the file's (`file_stamp`).

    A restart whose fingerprint is the one stamped, while nothing else has written those
    schedules since (`sync.stamped`), converts, reads and syncs none of them: the registry is
    what the sync would leave. `emq_bridge_boot_stamp = False` always does it all. Whatever
    is to be synced is validated before the first write.
    """
    source, generation = _source(app), _generation(app)
    stamps = flag_setting(app, "emq_bridge_boot_stamp", True)
    entries = _beat_entries(app)
    fingerprint = app_fingerprint(app, entries, _DECLARED) if stamps else None
    vouched = _vouched(repeat, source, fingerprint)
    path = _setting(app, "emq_bridge_schedule_file")
    file = _file_stamp(repeat, str(path), generation, app) if path and stamps else None
    plan = _app_schedule(app, (), entries) if vouched is None else None
    loaded = None
    if path and (file is None or not file.holds):
        from ..config import load_schedule_file  # lazily: only apps that name a file need it

        loaded = load_schedule_file(str(path))
    if plan is not None and loaded is not None:
        check_one_source(
            [
                (source, plan.entries),
                (plan.tasks_source, plan.tasks),
                (loaded.source, loaded.declarations),
            ]
        )
    synced: list[SyncPlan] = []
    if plan is not None:
        stamped_by = None
        if fingerprint is not None and not plan.custom:  # a custom schedule needs its object
            stamped_by = fingerprint
        # A schedule file whose stamp held was not read: the app may not take its names.
        unread = (file.source,) if file is not None and loaded is None else ()
        synced += _sync_own(app, repeat, plan, fingerprint=stamped_by, unread=unread)
    else:
        _log_unchanged(source, vouched[1] if vouched else 0)
    extra: tuple[tuple[str, tuple[Declaration, ...]], ...] = ()
    if loaded is not None:
        declared = tuple(loaded.declarations)
        extra = ((loaded.source, declared),)
        its_stamp = file.stamp_for(loaded) if file else None
        synced_file = sync(
            repeat,
            declared,
            loaded.source,
            prune_tasks=_file_pruned(app),
            empty_prunes=False,
            generation=generation,
            stamp=its_stamp,
            # the app's, when vouched
            unread_sources=(source, tasks_source(source)) if plan is None else (),
        )
        synced.append(synced_file)
        file_queues = _file_queues(extra)
    elif file is not None and file.queues is not None:
        _log_unchanged(file.source, file.declared or 0)
        file_queues = set(file.queues)
    else:
        file_queues = set()
    if plan is not None:
        pumped = tuple(sorted(set(plan.queues) | file_queues))
        return replace(plan, queues=pumped, extra=extra, synced=tuple(synced))
    assert vouched is not None
    return AppSchedule(
        source,
        (),
        {},
        tuple(sorted(set(vouched[0]) | _app_queues(app, ()) | file_queues)),
        extra,
        generation=generation,
        vouched=vouched[1],
        synced=tuple(synced),
    )


def _sync_own(
    app: Celery,
    repeat: Repeat,
    plan: AppSchedule,
    *,
    fingerprint: str | bool | None,
    unread: Sequence[str] = (),
) -> list[SyncPlan]:
    """The beat's sync of the app's own schedules; return the applied plans, `beat_schedule`'s
    first. The `@recurring` tasks go first: an older version synced them under `source`, and
    taking them over keeps their next runs (an owner change is no cadence change), where the
    `beat_schedule` sync would remove them. Of the tasks' schedules it no longer declares, it
    removes only those of tasks the app knows: a task only the workers import (`celery worker
    -I`) may well still be decorated there. `fingerprint` stamps both syncs (a str: the app's,
    with what the stamp's summary tells a restart; True: `sync(stamp=True)`'s own)."""

    def stamp_of(declarations: Sequence[Declaration]) -> Stamp | bool | None:
        if isinstance(fingerprint, str):
            return Stamp.of_queues(fingerprint, declarations)
        return fingerprint

    generation = plan.generation
    tasks = sync(
        repeat,
        plan.tasks,
        plan.tasks_source,
        generation=generation,
        stamp=stamp_of(plan.tasks),
        unread_sources=unread,
        prune_tasks=frozenset(app.tasks),
        read_queues=plan.queues,  # the entries' too: its stamp must be in every queue
        generation_sources=(plan.source,),
    )
    entries = sync(
        repeat,
        plan.entries,
        plan.source,
        generation=generation,
        stamp=stamp_of(plan.entries),
        unread_sources=unread,
        generation_sources=(plan.tasks_source,),
    )
    for applied in (entries, tasks):
        _warn_removed_elsewhere(applied, plan.queues)
    _warn_kept_unpumped(tasks, plan.queues)
    return [entries, tasks]


def _warn_kept_unpumped(applied: SyncPlan, queues: Sequence[str]) -> None:
    """Say so when the sync kept `@recurring` schedules (of tasks only the workers import) in
    queues the beat does not pump: nothing sends their slots until a pump serves them."""
    unpumped = sorted({queue for queue, _, _ in applied.kept} - set(queues))
    if unpumped:
        log.warning(
            "emq-bridge: sync %s kept schedules in queue(s) %s, which this beat does not "
            "pump: their tasks are ones only the workers import; add the queues to "
            "emq_bridge_queues so that the beat sends them",
            applied.source,
            ", ".join(unpumped),
        )


def _warn_removed_elsewhere(applied: SyncPlan, queues: Sequence[str]) -> None:
    """Say so when the app's sync removed schedules from queues the app does not use: the
    schedules an entry moved away from, or another app's that shares the source (two apps
    both named `Celery("tasks")` on one registry delete each other's at each boot)."""
    moved = {(queue, d.name) for d, queue in moves_of(applied)}  # said as moves by the sync
    elsewhere = sorted({q for q, n in applied.remove if (q, n) not in moved} - set(queues))
    if elsewhere:
        log.warning(
            "emq-bridge: sync %s removed schedules in queue(s) %s, which this app does not "
            "pump; if another app shares this registry under the same source, give each app "
            "its own emq_bridge_source (or emq_bridge_prefix)",
            applied.source,
            ", ".join(elsewhere),
        )


def _log_unchanged(source: str, count: int) -> None:
    log.info(
        "emq-bridge: %s unchanged since its last sync (%d schedule(s)): not converted, no "
        "record read",
        source,
        count,
    )


def _file_source(app: Celery) -> tuple[str, ...]:
    """The source of the app's schedule file (`emq_bridge_schedule_file`), read from its
    top-level keys alone; none when the app names no file or it cannot be read here."""
    path = _setting(app, "emq_bridge_schedule_file")
    found = file_fingerprint(str(path)) if path else None
    return (found[0],) if found is not None else ()


def boot_sources(app: Celery, plan: AppSchedule) -> tuple[str, ...]:
    """The sources `plan`'s boot synced (or found stamped): the app's two, then its schedule
    file's, if it names one that can be read here."""
    files = tuple(source for source, _ in plan.extra) or _file_source(app)
    return (plan.source, plan.tasks_source, *files)


def _file_pruned(app: Celery) -> frozenset[str]:
    """The tasks whose schedules the app's schedule-file sync removes when the file no longer
    declares them: the app's own. Two apps' files may share a source (`file:schedules.toml`,
    the default), and each would otherwise remove the other's at every boot, whatever their
    `emq_bridge_source` (the Dramatiq middleware prunes by its broker's actors alike)."""
    return frozenset(app.tasks)


def _file_stamp(repeat: Repeat, path: str, generation: int | None, app: Celery) -> FileStamp | None:
    """The schedule file's stamp, checked against the tasks its sync prunes (`_file_pruned`);
    None when the registry cannot say (the full path then reports the file's errors first,
    and the registry's)."""
    try:
        return file_stamp(repeat, path, generation, ";".join(sorted(_file_pruned(app))))
    except EmqError as exc:
        log.debug("emq-bridge: the schedule file's stamp could not be read: %s", exc)
        return None


def _vouched(
    repeat: Repeat, source: str, fingerprint: str | None
) -> tuple[tuple[str, ...], int] | None:
    """The queues and count of the app's schedules when its last stamped syncs (of
    `beat_schedule` under `source`, of the `@recurring` tasks under `tasks_source`) were of
    `fingerprint` and both still hold; else None (also for a summary this version cannot
    read, and when the registry cannot say: the full path then reports the declarations'
    errors first, and the registry's)."""
    if fingerprint is None:
        return None
    found = []
    for each in (source, tasks_source(source)):
        try:
            summary = queues_of(stamped(repeat, each, fingerprint))
        except EmqError as exc:
            log.debug("emq-bridge: the boot stamp could not be read: %s", exc)
            return None
        if summary is None:
            return None
        found.append(summary)
    (entry_queues, entries), (task_queues, tasks) = found
    return tuple(sorted({*entry_queues, *task_queues})), entries + tasks


def sync_app(
    app: Celery,
    repeat: Repeat | None = None,
    plan: AppSchedule | None = None,
    *,
    beat: bool = True,
    stamp: bool = False,
) -> list[SyncPlan]:
    """Sync the app's declared schedules into the registry; return the applied plans.

    The beat's sync (`beat=True`, the owner's): the `@recurring` tasks under `tasks_source`
    and `beat_schedule` under `source`, removing what the app no longer declares (of the
    tasks' schedules, those of tasks it knows), then the schedule file under its own source.
    A worker's (`beat=False`): its `@recurring` tasks under `tasks_source`, removing the
    schedules of the tasks it knows and no longer declares (its `beat_schedule` is not even
    converted). Every sync carries
    `emq_bridge_generation`. What is synced is validated before the first write. Raises
    `ConfigError` on bad input and `RegistryError` when Redis fails midway (running it again
    converges). The beat itself boots through `boot_schedule`, which stamps its syncs;
    `stamp=True` stamps the beat's syncs with their declarations (`sync(stamp=True)`: an
    unchanged restart reads no record), as `emq-bridge pump --celery` does.
    """
    plan = plan or (app_schedule(app) if beat else decorated_schedule(app))
    own = repeat is None
    repeat = repeat or repeat_for(app)
    generation = plan.generation
    try:
        if not beat:
            # The schedule file is the beat's to read; its names are not the tasks' to take.
            unread = _file_source(app)
            return [
                sync(
                    repeat,
                    plan.tasks,
                    plan.tasks_source,
                    # As the beat: the schedules of the tasks it knows and no longer
                    # declares (a decorator removed, a queue changed) go, whoever imports
                    # the task (a task only the workers import has no other pruner).
                    prune_tasks=frozenset(app.tasks),
                    generation=generation,
                    unread_sources=unread,
                    # An older beat or worker must not write the app's source either.
                    generation_sources=(plan.source,),
                )
            ]
        plans = _sync_own(app, repeat, plan, fingerprint=stamp or None)
        plans += [
            sync(
                repeat,
                decls,
                source,
                generation=generation,
                stamp=stamp or None,
                prune_tasks=_file_pruned(app),
                empty_prunes=False,
            )
            for source, decls in plan.extra
        ]
    finally:
        if own:
            repeat.close()
    return plans


def _sync_on_worker_start(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Sync the `@recurring` tasks when a `celery worker` starts (`celeryd_after_setup`).

    Every worker that imports `emq_bridge.celery` does, with or without `@recurring` tasks
    of its own: a worker whose last decorator was removed still prunes that task's schedule
    (a task only the workers import has no other pruner). An app that names no registry
    and declares nothing is left alone. That signal comes once logging is set up, so the
    sync's plan is visible at `-l info`. Celery swallows signal errors, so a failure is
    logged loudly instead.
    """
    app = getattr(instance, "app", None)
    if app is None:
        return
    declares = bool(own_tasks(app, _DECLARED))
    try:
        if not declares:
            try:
                registry_url(app)
            except ConfigError:
                return  # no registry to prune, nothing to write
        sync_app(app, beat=False)
    except Exception as exc:
        if declares:
            log.error("emq-bridge: boot-time sync of the schedules FAILED: %s", exc, exc_info=True)
        else:  # only a prune was due: said, without the alarm of a failed sync
            log.warning("emq-bridge: the worker's @recurring schedules were not checked: %s", exc)


# Connected on import: a worker syncs (and prunes) whether or not its code still declares any.
celeryd_after_setup.connect(_sync_on_worker_start, weak=False, dispatch_uid="emq_bridge.celery")
