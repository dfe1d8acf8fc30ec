"""Commands that run things: sync a schedule file, pump occurrences, the demo."""

from __future__ import annotations

import importlib
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click
import redis
from click.core import ParameterSource

from .. import targets
from ..config import ScheduleFile, load_schedule_file
from ..definition import Declaration
from ..dispatch import Dispatcher, ListPushDispatcher, PumpTarget
from ..errors import ConfigError, RegistryError
from ..file_stamp import FileStamp, file_stamp
from ..heartbeat import MAX_HEARTBEAT_TTL_S, Heartbeat
from ..outcome import HISTORY_SIZE
from ..pump import Pump
from ..pump_options import MAX_BATCH_SIZE, MAX_LEASE_MS, MAX_SLEEP_S
from ..registry import Registration, Repeat
from ..replies import redis_errors, text
from ..resync import RegistryWatch
from ..sync import SyncPlan, apply_plan, check_not_emptied, moves_of, plan_sync, sync
from .context import (
    FiniteRange,
    ServerError,
    Settings,
    client_address,
    client_location,
    given_as,
    pass_settings,
    redact_url,
    utf8_option,
)
from .frameworks import framework_options, given_frameworks, load_target
from .metrics import metrics_options, require_metrics, serve_pump_metrics
from .render import to_json
from .stopping import STOP_DEADLINE_S, StopOverdue, stop_on_signals

__all__ = ["COMMANDS"]

log = logging.getLogger(__name__)

T = TypeVar("T")
# `pump --once` ticks at most this often for what is due now (a backlog of `all` slots).
ONCE_MAX_TICKS = 1000


# -- sync -------------------------------------------------------------------------------------


def _change(old: Registration | None, new: Declaration, source: str) -> str:
    """Describe what an update changes: the cadence, the bounds, the template, the policies,
    the owner."""
    cadence = new.definition.cadence.describe()
    if old is None:
        return f"{cadence}  (recreated)"
    notes = []
    if old.definition.cadence.describe() != cadence:
        notes.append(f"{old.definition.cadence.describe()} -> {cadence}")
    else:
        notes.append(cadence)
    bounds_before, bounds_after = old.definition.bounds, new.definition.bounds
    if bounds_before != bounds_after:
        words_before, words_after = bounds_before.describe(), bounds_after.describe()
        notes.append(f"bounds {words_before or 'none'} -> {words_after or 'none'}")
    if old.definition.template_json != new.definition.template_json:  # a reorder too
        notes.append("template changed")
    if old.definition.misfire != new.definition.misfire:
        notes.append(f"misfire {old.definition.misfire} -> {new.definition.misfire}")
    for field in ("catchup_window_ms", "catchup_max"):
        before_value, after_value = getattr(old.definition, field), getattr(new.definition, field)
        if before_value != after_value:
            notes.append(f"{field} {before_value or '-'} -> {after_value or '-'}")
    if old.definition.overlap != new.definition.overlap:
        notes.append(f"overlap {old.definition.overlap} -> {new.definition.overlap}")
    before, after = old.definition.pause_after_failures, new.definition.pause_after_failures
    if before != after:
        notes.append(f"pause after failures {before or 'never'} -> {after or 'never'}")
    if dict(old.definition.labels) != dict(new.definition.labels):
        notes.append(f"labels {_labels(old.definition.labels)} -> {_labels(new.definition.labels)}")
    if old.source != source:
        notes.append(f"owner {old.source or 'runtime'} -> {source}")
    return ", ".join(notes)


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"


def _plan_lines(plan: SyncPlan, old: dict[tuple[str, str], Registration]) -> list[tuple[str, str]]:
    """Return the plan as `(colour, line)` pairs: `+` create, `~` update, `-` remove, `=` same
    (a queue move is a `+` and a `-`, each saying where it moves)."""
    found = moves_of(plan)
    moved_to = {(queue, d.name): d.queue for d, queue in found}  # by the removed one
    moved_from = {(d.queue, d.name): queue for d, queue in found}  # by the created one

    def origin(d: Declaration) -> str:
        queue = moved_from.get((d.queue, d.name))
        return f"  (moved from queue {queue})" if queue else ""

    lines = [
        (
            "green",
            f"+ {d.queue}/{d.name}  {d.definition.cadence.describe()}{plan.adopts(d)}{origin(d)}",
        )
        for d in plan.create
    ]
    lines += [
        ("yellow", f"~ {d.queue}/{d.name}  {_change(old.get((d.queue, d.name)), d, plan.source)}")
        for d in plan.update
    ]
    for queue, name in plan.remove:
        was = old.get((queue, name))
        moved = moved_to.get((queue, name))
        lines.append(
            (
                "red",
                f"- {queue}/{name}"
                + (f"  {was.definition.cadence.describe()}" if was else "")
                + (f"  (moved to queue {moved})" if moved else ""),
            )
        )
    lines += [
        ("", f"= {d.queue}/{d.name}  {d.definition.cadence.describe()}") for d in plan.unchanged
    ]
    return lines


def _plan_json(plan: SyncPlan, dry_run: bool) -> dict[str, Any]:
    def item(d: Declaration) -> dict[str, str]:
        return {"queue": d.queue, "name": d.name, "cadence": d.definition.cadence.describe()}

    return {
        "source": plan.source,
        "dry_run": dry_run,
        "create": [item(d) for d in plan.create],
        "update": [item(d) for d in plan.update],
        "remove": [{"queue": q, "name": n} for q, n in plan.remove],
        "unchanged": [item(d) for d in plan.unchanged],
    }


@contextmanager
def _own_diff(verbosity: int) -> Iterator[None]:
    """Hold back the sync's own WARNING line per changed schedule (what a boot sync logs)
    unless `-v` asks for more: the command prints each change once, as its diff."""
    logger = logging.getLogger("emq_bridge.sync")
    if verbosity > 0:
        yield
        return
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _stamp_of(repeat: Repeat, file: str) -> FileStamp | None:
    """The file's stamp (`file_stamp`); None when the registry cannot say, so that the file's
    own errors are reported first (the full sync then reports the registry's)."""
    try:
        return file_stamp(repeat, file)
    except RegistryError:
        return None


@click.command("sync")
# A directory is bad input (exit 1), as any file that cannot be read (read_bounded).
@click.argument("file", type=click.Path())
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option(
    "--prune/--no-prune",
    default=True,
    show_default=True,
    help="Remove schedules this file's source declared before and no longer declares.",
)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Let a file that declares no schedule remove every schedule of its source.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@pass_settings
def sync_command(
    settings: Settings, file: str, dry_run: bool, prune: bool, allow_empty: bool, as_json: bool
) -> None:
    """Sync a schedule file; print the plan as a diff.

    `+` created, `~` updated, `-` removed, `=` unchanged (nothing written for it, so its
    live cadence is kept). Only schedules tagged with the file's `source` are removed;
    schedules the file does not name, such as those added at runtime, are never touched.
    The whole file is validated first: if any entry is invalid, nothing is written.
    A file that declares no schedule while its source has some is refused (an emptied or
    truncated file would remove them all), unless --allow-empty. A file whose bytes are
    those of its last sync, when nothing else has written its
    schedules since, is not read again: the registry holds a stamp of that sync.

    \b
    Examples:
      emq-bridge sync schedules.toml --dry-run
      emq-bridge sync schedules.toml
      emq-bridge sync schedules.toml --no-prune --json
    """
    repeat = settings.repeat()
    # `--json` lists every schedule, so it reads them all; it stamps as a plain sync does.
    found = _stamp_of(repeat, file) if prune and not dry_run else None
    if found is not None and found.holds and not as_json:
        click.echo(f"# {file} (source {found.source}) -> {settings.where}", err=True)
        click.echo(
            f"0 created, 0 updated, 0 removed, {found.declared} unchanged "
            "(the file and its schedules are as its last sync left them: nothing read)",
            err=True,
        )
        return
    schedule_file = load_schedule_file(file)
    stamp = found.stamp_for(schedule_file) if found is not None else None
    plan = plan_sync(
        repeat,
        schedule_file.declarations,
        schedule_file.source,
        prune=prune,
        stamped=stamp is not None,
    )
    if not allow_empty:
        try:
            check_not_emptied(
                plan, len(schedule_file.declarations), " (--allow-empty removes them)"
            )
        except ConfigError as exc:
            if not dry_run:
                raise
            # The plan is shown, with what the sync itself would say.
            click.echo(f"note: without --dry-run: {exc}", err=True)
    touched: dict[str, list[str]] = {}
    for queue, name in [*((d.queue, d.name) for d in plan.update), *plan.remove]:
        touched.setdefault(queue, []).append(name)
    # One read per chunk of records, not a round trip each: a file may change them all.
    old = {
        (queue, name): registration
        for queue, names in touched.items()
        for name, registration in repeat.get_many(queue, names).items()
    }
    if not dry_run:  # the plan shown is the one applied: the registry is read once
        with _own_diff(settings.verbosity):
            plan = apply_plan(repeat, plan, stamp=stamp)
    if as_json:
        click.echo(to_json(_plan_json(plan, dry_run)))
        return
    click.echo(f"# {file} (source {schedule_file.source}) -> {settings.where}", err=True)
    lines = _plan_lines(plan, old)
    if lines:  # one write: a file of 100,000 schedules prints as many lines
        click.echo(
            "\n".join(click.style(line, fg=colour) if colour else line for colour, line in lines)
        )
    moves = len(moves_of(plan))
    click.echo(
        f"{len(plan.create)} created, {len(plan.update)} updated, {len(plan.remove)} removed, "
        f"{len(plan.unchanged)} unchanged"
        + (f" ({moves} of each a queue move)" if moves else "")
        + (" (dry run: nothing written)" if dry_run else ""),
        err=True,
    )


# -- pump -------------------------------------------------------------------------------------


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@click.command("pump")
@click.argument("queues", nargs=-1)
@framework_options(
    lambda framework: (
        f"Send through the {framework} adapter; SPEC names the application "
        "(module or module:attribute)."
    )
)
@click.option(
    "--list-key",
    metavar="KEY",
    callback=utf8_option,
    help="Push each occurrence as JSON onto this Redis list (no adapter needed).",
)
@click.option(
    "-f",
    "--file",
    "files",
    multiple=True,
    type=click.Path(),  # a directory: exit 1, as any file that cannot be read
    help="Sync this schedule file first and pump its queues (repeatable).",
)
@click.option(
    "--sync/--no-sync",
    "do_sync",
    default=True,
    show_default=True,
    help="Sync the target's declared schedules and the --file files before pumping.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_BATCH_SIZE),
    default=500,
    show_default=True,
    help="Occurrences claimed per round trip.",
)
@click.option(
    "--lease-ms",
    type=click.IntRange(1, MAX_LEASE_MS),
    default=60_000,
    show_default=True,
    help="How long a claimed occurrence waits for its ack before any pump re-sends it.",
)
@click.option(
    "--max-sleep",
    type=FiniteRange(0.01, MAX_SLEEP_S),
    default=5.0,
    show_default=True,
    help="Longest sleep between ticks, in seconds.",
)
@click.option(
    "--pipelined",
    is_flag=True,
    help="With --dramatiq or --celery on a Redis broker: send each claimed batch in one "
    "pipeline (the adapter's opt-in fast path; docs/celery.md and docs/dramatiq.md say what "
    "it skips).",
)
@click.option("--once", is_flag=True, help="Fire what is due now, then exit.")
@click.option(
    "--force-registry",
    is_flag=True,
    help="With an adapter: pump the registry of --redis-url/$REDIS_URL and --prefix even "
    "where the app's own (its beat's, its workers') differs.",
)
@click.option(
    "--heartbeat-ttl",
    type=FiniteRange(0.1, MAX_HEARTBEAT_TTL_S),
    metavar="SECONDS",
    help="How long the pump's heartbeat lives (`emq-bridge pumps`, `health`): a pump that "
    "dies is shown alive this long. Default: 30, or three sleeps and heartbeats.",
)
@metrics_options
@pass_settings
def pump_command(
    settings: Settings,
    /,
    *,
    queues: tuple[str, ...],
    list_key: str | None,
    files: tuple[str, ...],
    do_sync: bool,
    batch_size: int,
    lease_ms: int,
    max_sleep: float,
    pipelined: bool,
    once: bool,
    force_registry: bool,
    heartbeat_ttl: float | None,
    metrics_port: int | None,
    metrics_host: str,
    **target_specs: str | None,
) -> None:
    """Pump due occurrences into Dramatiq, Celery (any installed adapter) or a Redis list.

    Give exactly one target: --dramatiq, --celery (or another installed adapter's option),
    or --list-key. The queues are the ones
    named, plus those of the target and of each --file. Runs until SIGTERM or Ctrl-C, which
    settle the batch in hand (what is not sent within half a second is handed back to the
    next pump, same ids) and stop; any number of pumps may run on the same queues.

    An adapter's app brings its registry (the Celery app's emq_bridge_redis_url or Redis
    broker and emq_bridge_prefix; the Dramatiq RecurringMiddleware's), and its lease and
    sleep settings: the pump uses them, so it fires the same occurrences as the app's beat
    or workers, once. A --redis-url, $REDIS_URL or --prefix naming another registry is an
    error (exit 2) unless --force-registry; --lease-ms and --max-sleep given win.

    \b
    Examples:
      emq-bridge pump --dramatiq app.tasks
      emq-bridge pump --celery proj.celery:app -f schedules.toml
      emq-bridge pump --celery proj.celery:app --pipelined
      emq-bridge pump reports emails --list-key jobs:incoming
      emq-bridge pump reports --list-key jobs:incoming --once
    """
    given = given_frameworks(target_specs)
    chosen = [f"--{name}" for name, _ in given] + (["--list-key"] if list_key else [])
    if len(chosen) != 1:
        options = " SPEC, ".join(f"--{name}" for name in targets.frameworks())
        raise click.UsageError(
            f"give exactly one target: {options} SPEC or --list-key KEY"
            + (f" (got {' and '.join(chosen)})" if chosen else "")
        )
    if pipelined and list_key:
        raise click.UsageError("--pipelined applies to --dramatiq and --celery only")
    if metrics_port is not None:
        require_metrics()
    if settings.verbosity == 0:  # a long-running pump logs its syncs and outages by default
        logging.getLogger("emq_bridge").setLevel(logging.INFO)
    schedule_files = [load_schedule_file(f) for f in files]  # validate every file before writing
    target = load_target(*given[0], pipelined) if given else None
    repeat = _registry(settings, target, force_registry)
    # Fail fast (exit 3) on a wrong URL or password; outages after this are retried.
    repeat.server_time_ms()
    if list_key:
        _check_list_key(settings.client(), str(list_key))
    all_queues = _unique(
        [
            *queues,
            *(target.queues if target else ()),
            *(q for f in schedule_files for q in f.queues),
        ]
    )
    if not all_queues:
        raise click.UsageError(
            "no queues to pump: name them, or give --file or an adapter with queues"
        )
    dispatcher: Dispatcher = (
        target.dispatcher if target else ListPushDispatcher(settings.client(), str(list_key))
    )
    pump = Pump(
        repeat,
        all_queues,
        dispatcher,
        batch_size=batch_size,
        lease_ms=_app_default("lease_ms", lease_ms, target.lease_ms if target else None),
        max_sleep_s=_app_default("max_sleep", max_sleep, target.max_sleep_s if target else None),
        resolve_cadence=target.resolve_cadence if target else None,
        code=target.code if target else None,
        history_size=_history_size(target),
    )
    if heartbeat_ttl is not None:
        try:
            pump.heartbeat = Heartbeat(
                pump.queues, max_sleep_s=pump.max_sleep_s, ttl_s=heartbeat_ttl
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--heartbeat-ttl'") from exc
    if metrics_port is not None:  # an address that cannot be bound: before anything is written
        click.echo(f"metrics on {serve_pump_metrics(pump, metrics_host, metrics_port)}", err=True)
    watch = None
    if do_sync:  # once every option is known good: a refused command writes nothing
        plans = _sync_sources(repeat, target, schedule_files)
        if not once:  # a registry restarted empty gets them back, as the boot synced them
            watch = RegistryWatch(
                repeat,
                all_queues,
                [plan.source for plan in plans],
                lambda: _apply_sources(repeat, target, schedule_files),
            )
            pump.add_listener(watch)
    # A record the target's source rewrites after this is newer code's: not parked here.
    synced_ms = repeat.server_time_ms()
    pump.code_synced_ms = synced_ms if pump.code is not None else None
    if once:
        pump.check_eviction_policy()
        dispatched, failed = _fire_due_now(pump, synced_ms)
        click.echo(f"dispatched {dispatched}, failed {failed}")
        if failed:
            raise click.ClickException(
                f"{failed} occurrence(s) could not be dispatched; see the log"
            )
        return
    where = target.source if target else f"list {list_key}"
    stop = threading.Event()
    if watch is not None:
        watch.start()
    try:
        with stop_on_signals(stop):  # before it says so: Ctrl-C from then on stops it, exit 0
            click.echo(
                f"pumping {', '.join(all_queues)} -> {where} on {settings.where}; Ctrl-C to stop",
                err=True,
            )
            pump.run(stop)
    except StopOverdue:
        log.warning(
            "a send did not return within %.1fs of the stop (a broker that hangs?): it was "
            "interrupted; what was sent is acked, the rest handed back to the next pump (the "
            "occurrence whose send hung may reach its broker twice, same id, marked redelivered)",
            STOP_DEADLINE_S,
        )
    finally:
        if watch is not None:
            watch.stop()
    click.echo("pump stopped", err=True)


def _check_list_key(client: redis.Redis, key: str) -> None:
    """`--list-key` must name a list, or no key yet: a push to a key of another type would
    fail every occurrence (each logged, its lease kept), so refuse it before the first."""
    with redis_errors(f"check --list-key {key}"):
        kind = text(client.type(key))
    if kind not in ("list", "none"):
        raise click.BadParameter(f"{key!r} holds a {kind}, not a list", param_hint="'--list-key'")


def _fire_due_now(pump: Pump, now_ms: int) -> tuple[int, int]:
    """`pump --once`: fire what is due at `now_ms`, tick after tick while a tick leaves
    something due (a `misfire="all"` schedule sends one slot a claim, so its backlog takes
    a tick a slot), at most `ONCE_MAX_TICKS` ticks; return what was dispatched and failed."""
    dispatched = failed = 0
    for _ in range(ONCE_MAX_TICKS):
        tick = pump.run_once(now_ms)
        dispatched += len(tick.dispatched)
        failed += len(tick.failed)
        due_again = tick.next_wake_ms is not None and tick.next_wake_ms <= now_ms
        if not tick.dispatched or not due_again:
            break
    return dispatched, failed


def _apply_sources(
    repeat: Repeat, target: PumpTarget | None, files: Sequence[ScheduleFile]
) -> list[SyncPlan]:
    """Sync the schedule files' and the target's declarations; return the applied plans."""
    if target is not None and target.check is not None:  # all refusals before the first write
        target.check(repeat, [(str(f.path), f.declarations) for f in files])
    # Stamped (`sync(stamp=True)`): a pump restarted on unchanged declarations reads no record.
    plans = [sync(repeat, f.declarations, f.source, stamp=True) for f in files]
    if target is not None and target.sync is not None:
        plans += target.sync(repeat)  # as the app's beat or workers sync at boot
    elif target is not None:
        plans.append(sync(repeat, target.declarations, target.source, stamp=True))
    return plans


def _sync_sources(
    repeat: Repeat, target: PumpTarget | None, files: Sequence[ScheduleFile]
) -> list[SyncPlan]:
    """`_apply_sources`, each plan told in one line on stderr; return the plans."""
    plans = _apply_sources(repeat, target, files)
    for plan in plans:
        if plan.refused_by is not None:
            click.echo(
                f"not synced {plan.source}: generation {plan.generation} is older than the live "
                f"{plan.refused_by}",
                err=True,
            )
            continue
        click.echo(
            f"synced {plan.source}: {len(plan.create)} created, {len(plan.update)} updated, "
            f"{len(plan.remove)} removed, {plan.unchanged_count} unchanged"
            + (f", {len(plan.kept)} kept (tasks this process does not know)" if plan.kept else "")
            + (" (its stamp holds: nothing read)" if plan.by_stamp else ""),
            err=True,
        )
    return plans


def _named_registry(settings: Settings, missing: str, app_prefix: str | None) -> Repeat:
    """The registry of an app that names none (`missing` says why): the server the user
    gave (--redis-url, $REDIS_URL), under the app's prefix unless --prefix was given; the
    command's default server is no guess to pump (and sync into) silently."""
    if given_as("redis_url") is None:
        raise ConfigError(f"{missing}; or name its server with --redis-url or $REDIS_URL")
    if given_as("prefix") is None and app_prefix is not None and app_prefix != settings.prefix:
        return Repeat(settings.client(), app_prefix)
    return settings.repeat()


class RegistryConflict(click.ClickException):
    """The registry given is not the app's: bad usage (exit 2), told in one line."""

    exit_code = 2


def _registry(settings: Settings, target: PumpTarget | None, force: bool) -> Repeat:
    """Return the registry to pump: the app's own, unless the user forced another.

    A pump on another server or prefix than the app's beat or workers would sync a second
    copy of the schedules and fire each slot twice, with different ids. So what the user
    gave (--redis-url, $REDIS_URL, --prefix) must name the app's registry; the rest is
    taken from the app. Nothing is read or written before the check.
    """
    app = target.repeat if target is not None else None
    if app is None and not force and target is not None and target.registry_missing:
        return _named_registry(settings, target.registry_missing, target.registry_prefix)
    if app is None or force:
        if app is not None:
            log.warning(
                "--force-registry: pumping %s, not the app's registry %s",
                settings.where,
                _where(app),
            )
            app.close()
        return settings.repeat()
    url_flag, prefix_flag = given_as("redis_url"), given_as("prefix")
    conflicts = []
    try:
        if url_flag is not None and not _same_server(settings.client(), app.client, app.prefix):
            conflicts.append(url_flag)
    except ServerError:
        app.close()
        raise
    if prefix_flag is not None and settings.prefix != app.prefix:
        conflicts.append(prefix_flag)
    if conflicts:
        app.close()
        named = " and ".join(conflicts)
        given = url_flag is not None
        server = redact_url(settings.redis_url) if given else client_address(app.client)
        prefix = settings.prefix if prefix_flag is not None else app.prefix
        raise RegistryConflict(
            f"{named} {'names' if len(conflicts) == 1 else 'name'} the registry {server} "
            f"(prefix {prefix!r}), but the app's beat or workers pump {_where(app)}: leave "
            f"{'it' if len(conflicts) == 1 else 'them'} out to pump the app's, or add "
            "--force-registry to pump the one given"
        )
    if url_flag is not None:  # the app's server, reached as the user says
        app.close()
        settings.prefix = app.prefix
        return settings.repeat()
    # The messages and the error boundary quote settings.where: make it the app's registry,
    # shown by its address (no credentials); the client is the app's own.
    settings.redis_url, settings.prefix = client_address(app.client), app.prefix
    click.get_current_context().call_on_close(app.close)
    return app


def _same_server(given: Any, app: Any, prefix: str) -> bool:
    """Whether two clients reach one server and database: the same location, or another
    spelling of it (`localhost` and `127.0.0.1`, a socket and a port) that both answer with
    one server's `run_id`, or, for a user refused INFO (an ACL with `-@dangerous`), that
    reads a throwaway key the other wrote under the registry's `prefix`. Asked only when the
    locations differ; a server that does not answer is taken as another one."""
    mine, theirs = client_location(given), client_location(app)
    if mine == theirs:
        return True
    if mine[0] == "client" or theirs[0] == "client" or mine[-1] != theirs[-1]:
        return False  # a cluster or sentinel pool, or another database
    try:
        return bool(given.info("server")["run_id"] == app.info("server")["run_id"])
    except redis.exceptions.NoPermissionError:
        return _sees_the_same_key(given, app, prefix)
    except (redis.RedisError, OSError, KeyError, TypeError):
        return False


def _sees_the_same_key(given: Any, app: Any, prefix: str) -> bool:
    """Whether `given` reads the key `app` just wrote (10 s at most, then removed)."""
    token = uuid.uuid4().hex
    key = f"{prefix}:same-server:{token}"
    try:
        app.set(key, token, px=10_000)
        try:
            found = given.get(key)
            return found is not None and text(found) == token
        finally:
            app.delete(key)
    except redis.exceptions.NoPermissionError:  # not another server: a user refused
        raise ServerError(
            "cannot tell whether the Redis URL given reaches the app's registry: Redis refused"
            f" INFO, and a user may not write or read a key under {prefix!r} (NOPERM): give"
            " the URL's user the app's key permissions, leave the URL out to pump the app's"
            " registry, or add --force-registry to pump the one given"
        ) from None
    except (redis.RedisError, OSError):
        return False


def _where(repeat: Repeat) -> str:
    return f"{client_address(repeat.client)} (prefix {repeat.prefix!r})"


def _history_size(target: PumpTarget | None) -> int:
    """`Pump(history_size=...)` as the app's workers keep it, when the app says: the pump's
    skipped and lost entries must not trim a longer history to the default."""
    if target is None or target.history_size is None:
        return HISTORY_SIZE
    return target.history_size


def _app_default(param: str, value: T, app_value: T | None) -> T:
    """Return `value` if the user gave the pump option `param`, else the app's (if it has one)."""
    source = click.get_current_context().get_parameter_source(param)
    given = source not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)
    return value if given or app_value is None else app_value


# -- demo -------------------------------------------------------------------------------------


@click.command("demo")
@pass_settings
def demo_command(settings: Settings) -> None:
    """Run the demo on an embedded server, or on the server of --redis-url / $REDIS_URL.

    On a server given, everything the demo writes is under a throwaway prefix
    (emq-demo-<random>, whatever --prefix says), and every key under it is deleted at
    the end.

    \b
    Examples:
      emq-bridge demo
      emq-bridge --redis-url redis://127.0.0.1:6379/0 demo
    """
    demo = importlib.import_module("emq_bridge.demo")
    try:  # the demo runs Dramatiq: without its extra, say which, in one line
        importlib.import_module("emq_bridge.dramatiq")
    except ImportError as exc:
        raise click.ClickException(f"the demo runs a Dramatiq worker: {exc}") from None
    if given_as("redis_url") is None:
        result = demo.main()
    else:
        settings.repeat().server_time_ms()  # exit 2 on a malformed URL, 3 if it is unreachable
        _check_demo_keys(settings.client())
        result = demo.main(url=settings.redis_url)
    if isinstance(result, int) and result:
        raise click.exceptions.Exit(result)


def _check_demo_keys(client: Any) -> None:
    """Exit 3 in one line if the URL's user may not write the demo's keys: they are under
    `emq-demo-<random>`, not the registry's prefix, which an ACL confined to its prefix
    refuses (else the demo's worker fails at boot with Redis's bare message)."""
    key = f"emq-demo-{uuid.uuid4().hex[:8]}:check"
    with redis_errors("write the demo's keys"):
        try:
            client.set(key, "1", px=10_000)
        except redis.exceptions.NoPermissionError:
            raise ServerError(
                "the demo writes its keys and channels under emq-demo-<random>, which the user"
                " of the Redis URL may not (NOPERM): allow ~emq-demo-* and &emq-demo-*, or run"
                " `emq-bridge demo` without --redis-url (an embedded server)"
            ) from None
        client.delete(key)


COMMANDS = (sync_command, pump_command, demo_command)
