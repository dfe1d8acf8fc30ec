"""Commands that switch schedulers: `import redbeat`, `import django-celery-beat`, `export`.

The importers read Celery schedule objects, so they live on the Celery side
(`emq_bridge.celery.importers.redbeat`, `.django`) and are imported only when their command runs:
the command line itself never imports Celery.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import select
import stat
import sys
import tempfile
from types import ModuleType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import redis
from click.core import ParameterSource

from ..cadence import Cron
from ..errors import ConfigError, InvalidName
from ..keys import validate_name
from ..migrate.export import FORMATS, Format, SourceLeftOut, export_registry, render
from ..migrate.plan import (
    ImportPlan,
    apply_import,
    left_behind_notes,
    queues_note,
    result_lines,
)
from ..urls import client_from_url, redact_url
from .context import (
    ServerError,
    Settings,
    SubcommandGroup,
    UrlError,
    given_as,
    pass_settings,
    refused_authentication,
    utf8_option,
)
from .render import to_json

__all__ = ["COMMANDS"]

# What one write of an export to stdout holds: a write a pipe cuts short (its reader gone)
# is followed by another, which fails (EPIPE), so a file cut short is never said exported.
STDOUT_CHUNK_BYTES = 64 * 2**10


def _celery_side(module: str) -> ModuleType:
    """Import an importer module (it needs Celery); a missing package is bad input."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc


def _apply(
    settings: Settings,
    plan: ImportPlan,
    dry_run: bool,
    strict: bool,
    as_json: bool,
    paused: bool = False,
    resume: bool = False,
    notes: tuple[str, ...] = (),
) -> None:
    if paused and resume:
        raise click.UsageError("--paused and --resume are the two ends of a cut-over: give one")
    result = apply_import(
        settings.repeat(), plan, dry_run=dry_run, strict=strict, paused=paused, resume=resume
    )
    note = queues_note(result)
    if not plan.entries and not plan.refused:
        # A wrong database or prefix reads as an empty scheduler: not a migration done.
        found = (
            "note: the old scheduler holds no schedule here (check its URL, database and prefix)"
        )
        note = f"{note}\n{found}" if note else found
    behind = left_behind_notes(settings.repeat(), plan)
    note = "\n".join(filter(None, [note, *notes, *behind]))
    if as_json:

        def items(entries: list[Any]) -> list[dict[str, Any]]:
            return [
                {
                    "origin": e.origin,
                    "queue": e.declaration.queue,
                    "name": e.declaration.name,
                    "cadence": e.declaration.definition.cadence.describe(),
                    "next_run_ms": e.seed.resume_ms if e.seed.paused else e.seed.first_run_ms,
                    "paused": e.seed.paused,
                }
                for e in entries
            ]

        click.echo(
            to_json(
                {
                    "source": result.source,
                    "dry_run": dry_run,
                    "created": items(result.created),
                    "updated": items(result.updated),
                    "unchanged": items(result.unchanged),
                    "refused": [{"origin": r.origin, "reason": r.reason} for r in result.refused],
                    "resumed": items(result.resumed),
                    "staged": items(result.staged),
                }
            )
        )
        if note:
            click.echo(note, err=True)
        return
    for line in result_lines(result):
        click.echo(line)
    if note:
        click.echo(note, err=True)
    click.echo(result.summary(), err=True)  # the last line, as ever


def _zone(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a directory
        raise click.BadParameter(
            f"unknown time zone {value!r}; use an IANA name such as 'Europe/Paris'"
        ) from exc
    return value


def _owner(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """`--source`, checked as a bad option (exit 2), before any row is read."""
    try:
        return validate_name(value, "source")
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from exc


def _queue(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return validate_name(value, "queue")
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from exc


_COMMON = [
    click.option(
        "--queue",
        default="celery",
        show_default=True,
        callback=_queue,
        help="Queue of tasks naming none.",
    ),
    click.option(
        "--timezone",
        default="UTC",
        show_default=True,
        metavar="ZONE",
        callback=_zone,
        help="The Celery app's timezone (what zone-less crontabs follow).",
    ),
    click.option("--dry-run", is_flag=True, help="Print the plan; write nothing."),
    click.option("--strict", is_flag=True, help="Write nothing if any schedule cannot be carried."),
    click.option(
        "--paused",
        is_flag=True,
        help="Create the registrations paused, while the old scheduler still runs them"
        " (and pause those that exist and fire here: a switch back to it).",
    ),
    click.option(
        "--resume",
        is_flag=True,
        help="Cut-over (old scheduler stopped): resume what is enabled there.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
]


def _common(func: Any) -> Any:
    for option in reversed(_COMMON):
        func = option(func)
    return func


@click.group("import", cls=SubcommandGroup)
def import_group() -> None:
    """Import the schedules of another Celery scheduler (re-running changes nothing).

    Each schedule becomes a registration under a source of its own (`import:redbeat`,
    `import:django-celery-beat`), starting at the slot the old scheduler would fire next;
    disabled ones are paused. What cannot be carried is listed with `!` and the reason. A
    `note:` line names the queues the schedules are in: a `celery beat -S emq` pumps only
    the app's queues and those in its emq_bridge_queues setting. See docs/migration.md for
    a switch without double firing.
    """


@import_group.command("redbeat")
@click.option("--from", "from_url", required=True, metavar="URL", help="celery-redbeat's Redis.")
@click.option(
    "--prefix",
    "--redbeat-prefix",
    "key_prefix",
    default="redbeat:",
    show_default=True,
    callback=utf8_option,
    help="celery-redbeat's key prefix (its redbeat_key_prefix setting).",
)
@click.option(
    "--source", default="import:redbeat", show_default=True, callback=_owner, help="Owner tag."
)
@_common
@pass_settings
def import_redbeat(
    settings: Settings,
    from_url: str,
    key_prefix: str,
    source: str,
    queue: str,
    timezone: str,
    dry_run: bool,
    strict: bool,
    paused: bool,
    resume: bool,
    as_json: bool,
) -> None:
    """Import celery-redbeat's entries (`redbeat:<name>` hashes) into the registry.

    \b
    Examples:
      emq-bridge import redbeat --from redis://old:6379/0 --dry-run
      emq-bridge import redbeat --from redis://old:6379/0 --timezone Europe/Paris
    """
    redbeat = _celery_side("emq_bridge.celery.importers.redbeat")
    try:
        old = client_from_url(from_url)
    except Exception as exc:
        raise UrlError(f"Invalid value for '--from': {exc}") from exc
    now_ms = settings.repeat().server_time_ms()
    try:
        plan = redbeat.read_redbeat(
            old,
            app=redbeat.importer_app(timezone, queue),
            now_ms=now_ms,
            key_prefix=key_prefix,
            source=source,
        )
    except redis.AuthenticationError as exc:  # a ConnectionError to redis-py
        where = f"{redact_url(from_url)} (celery-redbeat's)"
        raise ServerError(refused_authentication(where, exc)) from exc
    except redis.RedisError as exc:  # the old Redis, not the registry: say which
        raise ServerError(f"cannot read celery-redbeat at {redact_url(from_url)}: {exc}") from exc
    finally:
        old.close()
    notes: tuple[str, ...] = ()
    crontabs = sum(isinstance(e.declaration.definition.cadence, Cron) for e in plan.entries)
    zone_given = click.get_current_context().get_parameter_source("timezone")
    if crontabs and zone_given is ParameterSource.DEFAULT:
        # celery-redbeat keeps no zone with a crontab: it fires it in its app's `timezone`,
        # which only the user knows. A silent UTC would move a Paris 03:00 job by an hour.
        notes = (
            f"note: {crontabs} crontab schedule(s) read in UTC, the --timezone default; "
            "celery-redbeat fires them in its app's timezone setting: if that is not UTC, "
            "import again with --timezone ZONE",
        )
    _apply(settings, plan, dry_run, strict, as_json, paused, resume, notes)


@import_group.command("django-celery-beat")
@click.option(
    "--database-url",
    metavar="URL",
    help="django-celery-beat's database (postgresql://, mysql://, sqlite:///path); "
    "default: the project of $DJANGO_SETTINGS_MODULE.",
)
@click.option(
    "--source",
    default="import:django-celery-beat",
    show_default=True,
    callback=_owner,
    help="Owner tag.",
)
@click.option(
    "--stored-timezone",
    default="UTC",
    show_default=True,
    metavar="ZONE",
    callback=_zone,
    help="With a SQLite or MySQL --database-url: the zone its times are stored in (UTC for "
    "a project with USE_TZ = True, else its TIME_ZONE).",
)
@_common
@pass_settings
def import_django(
    settings: Settings,
    database_url: str | None,
    source: str,
    stored_timezone: str,
    queue: str,
    timezone: str,
    dry_run: bool,
    strict: bool,
    paused: bool,
    resume: bool,
    as_json: bool,
) -> None:
    """Import django-celery-beat's periodic tasks into the registry.

    Inside the project, `python manage.py emq_import` does the same (add
    "emq_bridge.celery.importers.django" to INSTALLED_APPS).

    \b
    Examples:
      emq-bridge import django-celery-beat --database-url postgresql://app@db/app --dry-run
      DJANGO_SETTINGS_MODULE=proj.settings emq-bridge import django-celery-beat
    """
    standalone = _celery_side("emq_bridge.celery.importers.django.standalone")
    if database_url is not None:
        standalone.setup(database_url, timezone, stored_timezone)
    elif os.environ.get("DJANGO_SETTINGS_MODULE"):
        _set_up_project(os.environ["DJANGO_SETTINGS_MODULE"])
        settings = _project_settings(settings)
    else:
        raise click.UsageError("give --database-url, or set DJANGO_SETTINGS_MODULE")
    reader = _celery_side("emq_bridge.celery.importers.django.reader")
    plan = reader.read_periodic_tasks(
        now_ms=settings.repeat().server_time_ms(), queue=queue, source=source
    )
    _apply(settings, plan, dry_run, strict, as_json, paused, resume)


def _set_up_project(module: str) -> None:
    """Set up the Django project of `DJANGO_SETTINGS_MODULE`, found from the current
    directory as `manage.py` and `celery -A` find it; `ConfigError` if it cannot be."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module("django").setup()
    except ImportError as exc:
        raise ConfigError(
            f"DJANGO_SETTINGS_MODULE={module!r} cannot be imported ({exc}): run this from the "
            "project's directory (where manage.py is), or add it to PYTHONPATH"
        ) from exc


def _project_settings(settings: Settings) -> Settings:
    """`settings` for an import from a Django project: the registry the project's Celery app
    names, as `manage.py emq_import` and its beat read it, where --redis-url, $REDIS_URL or
    --prefix do not name one; said on stderr, as `emq_import` says it."""
    url = settings.redis_url if given_as("redis_url") is not None else None
    prefix = settings.prefix if given_as("prefix") is not None else None
    if url is not None and prefix is not None:
        return settings
    project = _celery_side("emq_bridge.celery.importers.django.project")
    url, prefix = project.project_registry(url, prefix)
    chosen = Settings(redis_url=url, prefix=prefix, verbosity=settings.verbosity)
    click.echo(f"registry: {chosen.where}", err=True)
    return chosen


@click.command("export")
@click.argument("queues", nargs=-1)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="toml",
    show_default=True,
    help="The schedule file's format (sync reads a .json file as JSON).",
)
@click.option("--source", help="Export only what this source owns; the file declares it.")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here, not stdout."
)
@pass_settings
def export_command(
    settings: Settings, queues: tuple[str, ...], fmt: str, source: str | None, output: str | None
) -> None:
    """Write the registry as a schedule file that `emq-bridge sync` reads.

    Every queue, or the QUEUES given. What a file cannot declare is listed on stderr
    with the reason and left out (exit 0); paused states and counters stay in Redis.

    \b
    Examples:
      emq-bridge export > schedules.toml
      emq-bridge export reports --format json -o schedules.json
      emq-bridge export --source import:redbeat > schedules.toml
    """
    chosen: Format = "json" if fmt == "json" else "toml"
    try:
        export = export_registry(settings.repeat(), queues or None, source=source, fmt=chosen)
    except SourceLeftOut as exc:  # nothing written: name what a file cannot carry, and why
        _refused_lines(exc.refused)
        raise
    text = render(export, chosen)
    if output is None:
        _write_stdout(text.encode("utf-8"))  # TOML and JSON are UTF-8, whatever the locale
    else:
        try:
            replace_file(output, text.encode("utf-8"))
        except OSError as exc:
            raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from exc
    _refused_lines(export.refused)
    for note in export.notes:
        click.echo(note, err=True)
    click.echo(
        f"exported {len(export.entries)} schedule(s), {len(export.refused)} left out", err=True
    )


def replace_file(path: str, data: bytes) -> None:
    """Write `data` as the file `path` at once: into a new file beside it, then renamed over
    it, so that a full disk or a kill mid-write leaves the previous export whole (a file cut
    short is no schedule file). The file keeps its mode, or gets the umask's for a new one."""
    target = os.path.realpath(path)  # a symlink's target is replaced, not the link
    folder = os.path.dirname(target) or "."
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".emq-export-", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    current = os.umask(0)  # the only way to read it; set back at once
    os.umask(current)
    return current


def _write_stdout(data: bytes) -> None:
    """Write `data` whole to stdout, else `ClickException` (exit 1) saying why, as `-o` does.

    Not `click.echo`: a large write to a pipe whose reader is gone returns short, and the
    text layer drops the rest without an error (the export said "exported", exit 0).
    Written unbuffered, so nothing is left to fail at exit.
    """
    stream = sys.stdout
    binary: Any = getattr(stream, "buffer", None)
    raw: Any = getattr(binary, "raw", binary)  # FileIO: unbuffered
    try:
        stream.flush()
        if raw is None:  # a text stream a caller put there: text is what it takes
            stream.write(data.decode("utf-8"))
            stream.flush()
            return
        binary.flush()
        view = memoryview(data)
        while view:
            written = raw.write(view[:STDOUT_CHUNK_BYTES])
            if written is None:  # a non-blocking stdout that is full: wait until it is not
                select.select([], [raw], [])
                continue
            if not written:  # a file that takes nothing more: never a loop without end
                raise OSError(errno.EIO, "the write stopped short")
            view = view[written:]
    except OSError as exc:  # EPIPE (the reader stopped), ENOSPC
        raise click.ClickException(f"cannot write to stdout: {exc.strerror or exc}") from exc


def _refused_lines(refused: list[tuple[str, str, str]]) -> None:
    """List on stderr, with `!`, each registration a file cannot carry and why."""
    for queue, name, reason in refused:
        click.echo(f"! {queue}/{name}: {reason}", err=True)


COMMANDS = [import_group, export_command]
