"""Commands that run things: sync a schedule file, pump occurrences, the demo."""

from __future__ import annotations

import importlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click

from .. import targets
from ..config import ScheduleFile, load_schedule_file
from ..definition import Declaration
from ..dispatch import Dispatcher, ListPushDispatcher, PumpTarget
from ..pump import Pump
from ..registry import Registration, Repeat
from ..sync import SyncPlan, plan_sync, sync
from .context import Settings, pass_settings
from .render import to_json

__all__ = ["COMMANDS"]

log = logging.getLogger(__name__)


# -- sync -------------------------------------------------------------------------------------


def _change(old: Registration | None, new: Declaration, source: str) -> str:
    """Describe what an update changes: the cadence, the template, the misfire, the owner."""
    cadence = new.definition.cadence.describe()
    if old is None:
        return f"{cadence}  (recreated)"
    notes = []
    if old.definition.cadence.describe() != cadence:
        notes.append(f"{old.definition.cadence.describe()} -> {cadence}")
    else:
        notes.append(cadence)
    if dict(old.definition.template) != dict(new.definition.template):
        notes.append("template changed")
    if old.definition.misfire != new.definition.misfire:
        notes.append(f"misfire {old.definition.misfire} -> {new.definition.misfire}")
    if old.source != source:
        notes.append(f"owner {old.source or 'runtime'} -> {source}")
    return ", ".join(notes)


def _plan_lines(plan: SyncPlan, old: dict[tuple[str, str], Registration]) -> list[tuple[str, str]]:
    """Return the plan as `(colour, line)` pairs: `+` create, `~` update, `-` remove, `=` same."""
    lines = [
        ("green", f"+ {d.queue}/{d.name}  {d.definition.cadence.describe()}") for d in plan.create
    ]
    lines += [
        ("yellow", f"~ {d.queue}/{d.name}  {_change(old.get((d.queue, d.name)), d, plan.source)}")
        for d in plan.update
    ]
    for queue, name in plan.remove:
        was = old.get((queue, name))
        lines.append(
            ("red", f"- {queue}/{name}" + (f"  {was.definition.cadence.describe()}" if was else ""))
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


@click.command("sync")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option(
    "--prune/--no-prune",
    default=True,
    show_default=True,
    help="Remove schedules this file's source declared before and no longer declares.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@pass_settings
def sync_command(settings: Settings, file: str, dry_run: bool, prune: bool, as_json: bool) -> None:
    """Sync a schedule file; print the plan as a diff.

    `+` created, `~` updated, `-` removed, `=` unchanged (nothing written for it, so its
    live cadence is kept). Only schedules tagged with the file's `source` are removed;
    schedules the file does not name, such as those added at runtime, are never touched.
    The whole file is validated first: if any entry is invalid, nothing is written.

    \b
    Examples:
      emq-bridge sync schedules.toml --dry-run
      emq-bridge sync schedules.toml
      emq-bridge sync schedules.toml --no-prune --json
    """
    schedule_file = load_schedule_file(file)
    repeat = settings.repeat()
    plan = plan_sync(repeat, schedule_file.declarations, schedule_file.source, prune=prune)
    touched = [(d.queue, d.name) for d in plan.update] + list(plan.remove)
    old = {key: r for key in touched if (r := repeat.get(*key)) is not None}
    if not dry_run:
        plan = sync(repeat, schedule_file.declarations, schedule_file.source, prune=prune)
    if as_json:
        click.echo(to_json(_plan_json(plan, dry_run)))
        return
    click.echo(f"# {file} (source {schedule_file.source}) -> {settings.where}", err=True)
    for colour, line in _plan_lines(plan, old):
        click.secho(line, fg=colour or None)
    click.echo(
        f"{len(plan.create)} created, {len(plan.update)} updated, {len(plan.remove)} removed, "
        f"{len(plan.unchanged)} unchanged" + (" (dry run: nothing written)" if dry_run else ""),
        err=True,
    )


# -- pump -------------------------------------------------------------------------------------


def _load_target(framework: str, spec: str, pipelined: bool) -> PumpTarget:
    """Load the application at `spec` through the adapter registered as `framework`."""
    try:
        return targets.load_target(framework, spec, pipelined=pipelined)
    except ImportError as exc:
        raise click.ClickException(f"cannot load {spec!r} for {framework}: {exc}") from exc


def _target_param(framework: str) -> str:
    return "target_" + framework.replace("-", "_")


def _target_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add `--<framework> SPEC` for each framework target installed (`emq_bridge.targets`)."""
    for framework in reversed(list(targets.frameworks())):
        command = click.option(
            f"--{framework}",
            _target_param(framework),
            metavar="SPEC",
            help=f"Send through the {framework} adapter; SPEC names the application "
            "(module or module:attribute).",
        )(command)
    return command


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set `stop` on SIGTERM or SIGINT (a second SIGINT interrupts at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info(
            "%s received: finishing the batch in hand, then stopping", signal.Signals(signum).name
        )
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@click.command("pump")
@click.argument("queues", nargs=-1)
@_target_options
@click.option(
    "--list-key",
    metavar="KEY",
    help="Push each occurrence as JSON onto this Redis list (no adapter needed).",
)
@click.option(
    "-f",
    "--file",
    "files",
    multiple=True,
    type=click.Path(dir_okay=False),
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
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Occurrences claimed per round trip.",
)
@click.option(
    "--lease-ms",
    type=click.IntRange(min=1),
    default=60_000,
    show_default=True,
    help="How long a claimed occurrence waits for its ack before any pump re-sends it.",
)
@click.option(
    "--max-sleep",
    type=click.FloatRange(min=0.01),
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
    **target_specs: str | None,
) -> None:
    """Pump due occurrences into Dramatiq, Celery (any installed adapter) or a Redis list.

    Give exactly one target: --dramatiq, --celery (or another installed adapter's option),
    or --list-key. The queues are the ones
    named, plus those of the target and of each --file. Runs until SIGTERM or Ctrl-C, which
    finish the batch in hand; any number of pumps may run on the same queues.

    \b
    Examples:
      emq-bridge pump --dramatiq app.tasks
      emq-bridge pump --celery proj.celery:app -f schedules.toml
      emq-bridge pump --celery proj.celery:app --pipelined
      emq-bridge pump reports emails --list-key jobs:incoming
      emq-bridge pump reports --list-key jobs:incoming --once
    """
    frameworks = {_target_param(name): name for name in targets.frameworks()}
    given = [(frameworks[param], spec) for param, spec in target_specs.items() if spec]
    chosen = [f"--{name}" for name, _ in given] + (["--list-key"] if list_key else [])
    if len(chosen) != 1:
        options = " SPEC, ".join(f"--{name}" for name in frameworks.values())
        raise click.UsageError(
            f"give exactly one target: {options} SPEC or --list-key KEY"
            + (f" (got {' and '.join(chosen)})" if chosen else "")
        )
    if pipelined and list_key:
        raise click.UsageError("--pipelined applies to --dramatiq and --celery only")
    if settings.verbosity == 0:  # a long-running pump logs its syncs and outages by default
        logging.getLogger("emq_bridge").setLevel(logging.INFO)
    schedule_files = [load_schedule_file(f) for f in files]  # validate every file before writing
    repeat = settings.repeat()
    # Fail fast (exit 3) on a wrong URL or password; outages after this are retried.
    repeat.server_time_ms()
    target = _load_target(*given[0], pipelined) if given else None
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
    if do_sync:
        _sync_sources(repeat, target, schedule_files)
    dispatcher: Dispatcher = (
        target.dispatcher if target else ListPushDispatcher(settings.client(), str(list_key))
    )
    pump = Pump(
        repeat,
        all_queues,
        dispatcher,
        batch_size=batch_size,
        lease_ms=lease_ms,
        max_sleep_s=max_sleep,
        resolve_cadence=target.resolve_cadence if target else None,
    )
    if once:
        pump.check_eviction_policy()
        tick = pump.run_once()
        click.echo(f"dispatched {len(tick.dispatched)}, failed {len(tick.failed)}")
        if tick.failed:
            raise click.ClickException(
                f"{len(tick.failed)} occurrence(s) could not be dispatched; see the log"
            )
        return
    where = target.source if target else f"list {list_key}"
    click.echo(
        f"pumping {', '.join(all_queues)} -> {where} on {settings.where}; Ctrl-C to stop", err=True
    )
    stop = threading.Event()
    with _stop_on_signals(stop):
        pump.run(stop)
    click.echo("pump stopped", err=True)


def _sync_sources(repeat: Repeat, target: PumpTarget | None, files: Sequence[ScheduleFile]) -> None:
    plans = [sync(repeat, f.declarations, f.source) for f in files]
    if target is not None:
        plans.append(sync(repeat, target.declarations, target.source))
    for plan in plans:
        click.echo(
            f"synced {plan.source}: {len(plan.create)} created, {len(plan.update)} updated, "
            f"{len(plan.remove)} removed, {len(plan.unchanged)} unchanged",
            err=True,
        )


# -- demo -------------------------------------------------------------------------------------


@click.command("demo")
def demo_command() -> None:
    """Run the demo on an embedded server.

    It ignores --redis-url: everything runs on a throwaway server.

    \b
    Example:
      emq-bridge demo
    """
    result = importlib.import_module("emq_bridge.demo").main()
    if isinstance(result, int) and result:
        raise click.exceptions.Exit(result)


COMMANDS = (sync_command, pump_command, demo_command)
