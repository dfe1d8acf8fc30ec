"""Commands on registrations: list, show, history, next, add, remove, pause, resume, trigger."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import click

from .. import targets
from ..cadence import ANCHORS, MISFIRES
from ..config import declaration_from_entry
from ..definition import MAX_PAUSE_AFTER, OVERLAPS
from ..errors import ConfigError, EmqError
from ..keys import parse_lease_member
from ..outcome import FINAL_STATUSES, MAX_HISTORY_SIZE
from ..registry import Registration, Repeat
from ..template import MAX_TEMPLATE_DEPTH
from .context import Settings, pass_settings
from .frameworks import framework_options, framework_params, given_frameworks, load_target
from .render import (
    absolute,
    cadence_text,
    duration_text,
    history_row,
    iso,
    last_run_text,
    next_run_text,
    registration_json,
    relative,
    state_text,
    status_text,
    table,
    to_json,
    upcoming,
    zone_of,
)

__all__ = ["COMMANDS"]

T = TypeVar("T")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _lifecycle(move: Callable[[], T]) -> T:
    """Run a registry move that raises KeyError for an unknown name; exit 1 with its reason."""
    try:
        return move()
    except KeyError as exc:
        raise click.ClickException(
            str(exc.args[0]) if exc.args else "no such registration"
        ) from exc


def _require(repeat: Repeat, queue: str, name: str) -> Registration:
    registration = repeat.get(queue, name)
    if registration is None:
        raise click.ClickException(f"no registration {name!r} in queue {queue!r}")
    return registration


@click.command("list")
@click.argument("queue", required=False)
@json_option
@click.option(
    "--limit", type=click.IntRange(min=0), help="Show at most this many schedules (a page)."
)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Skip this many schedules first (the next page: --offset 50 --limit 50).",
)
@pass_settings
def list_command(
    settings: Settings, queue: str | None, as_json: bool, limit: int | None, offset: int
) -> None:
    """List schedules with their cadence, next and last run, last status, and state.

    Without QUEUE, list every queue under the prefix, queue by queue; each queue's schedules
    come in next-run order (paused last). The next run is shown in the schedule's time zone
    (UTC for intervals) and relative to the Redis server's clock. The records are read and
    printed a thousand at a time, so a registry of any size lists in bounded memory.
    The state is active, paused, or parked with the start of its reason: a dispatch that can
    never work, such as an unknown actor, or a streak of failures (--pause-after-failures)
    stopped it until it is resumed. The last status is what workers reported of the last
    occurrence (`-` if none reported yet): running, succeeded, failed (with the streak),
    retrying, skipped, lost or revoked.

    \b
    Examples:
      emq-bridge list
      emq-bridge list reports --limit 50 --offset 50
      emq-bridge list reports --json | jq '.[].next_run'
    """
    repeat = settings.repeat()
    queues = [queue] if queue is not None else repeat.queues()
    now_ms = repeat.server_time_ms()
    registrations = _page(repeat, queues, offset, limit)
    if as_json:
        for chunk in _json_array(registration_json(r, now_ms) for r in registrations):
            click.echo(chunk, nl=False)
        click.echo()
        return
    rows = [
        [
            r.queue,
            r.name,
            cadence_text(r),
            next_run_text(r, now_ms),
            last_run_text(r, now_ms),
            status_text(r),
            state_text(r),
        ]
        for r in registrations
    ]
    if not rows:
        where = f"queue {queue!r}" if queue is not None else f"prefix {settings.prefix!r}"
        click.echo(f"no schedules in {where}" + (" on this page" if offset else ""), err=True)
        return
    header = ["queue", "name", "cadence", "next run", "last run", "last status", "state"]
    click.echo(table(header, rows))


def _page(
    repeat: Repeat, queues: list[str], offset: int, limit: int | None
) -> Iterator[Registration]:
    """Yield the registrations of `queues`, in order, from `offset`, at most `limit`."""
    if limit is None and offset == 0:  # the whole registry, streamed
        for queue in queues:
            yield from repeat.iter_list(queue)
        return
    left = limit
    for queue in queues:
        if left == 0:
            return
        size = repeat.count(queue)
        if offset >= size:
            offset -= size
            continue
        page = repeat.list(queue, offset=offset, limit=left)
        offset = 0
        if left is not None:
            left -= len(page)
        yield from page


def _json_array(items: Iterator[dict[str, Any]]) -> Iterator[str]:
    """Yield the text of `to_json(list(items))`, an item at a time (no list in memory)."""
    first = True
    for item in items:
        body = to_json(item).replace("\n", "\n  ")
        yield ("[\n  " if first else ",\n  ") + body
        first = False
    yield "[]" if first else "\n]"


@click.command("show")
@click.argument("queue")
@click.argument("name")
@json_option
@pass_settings
def show_command(settings: Settings, queue: str, name: str, as_json: bool) -> None:
    """Show one schedule in full.

    Its cadence, state (for a parked one: since when, and why), next and last run, the last
    outcome workers reported (status, when, how long, the last error) and the failure
    streak, counters (`fired` counts the occurrences a broker accepted, `skipped` the slots
    the overlap policy skipped, `lost` the occurrences whose worker went silent), what is in
    flight or buffered, its policies, owner and template. `history` lists the occurrences.

    \b
    Examples:
      emq-bridge show reports digest
      emq-bridge show reports digest --json
    """
    repeat = settings.repeat()
    registration = _require(repeat, queue, name)
    now_ms = repeat.server_time_ms()
    data = registration_json(registration, now_ms)
    if as_json:
        click.echo(to_json(data))
        return
    zone = zone_of(registration.definition.cadence)
    last = "never"
    fired_ms = registration.last_fired_ms
    if fired_ms is not None:
        last = f"{absolute(fired_ms, zone)} ({relative(fired_ms, now_ms)})"
    state = data["state"]
    if registration.parked_ms is not None:
        since = registration.parked_ms
        state += f" since {absolute(since, zone)} ({relative(since, now_ms)})"
    lines = [
        ("cadence", data["cadence"]),
        ("state", state),
    ]
    if registration.parked_reason is not None:
        lines.append(("reason", registration.parked_reason))
        lines.append(("", f"fix it, then: emq-bridge resume {queue} {name}"))
    lines += [
        ("next run", next_run_text(registration, now_ms)),
        ("last run", last),
        *_outcome_lines(registration, now_ms),
        ("fired", str(registration.fired)),
        ("missed", str(registration.missed)),
        ("skipped", str(registration.skipped)),
        ("lost", str(registration.lost)),
        *_in_flight_lines(registration, now_ms),
        ("misfire", registration.definition.misfire),
        *_policy_lines(registration),
        ("source", registration.source or "(added at runtime)"),
        ("template", json.dumps(data["template"], sort_keys=True)),
    ]
    click.echo(f"{queue}/{name}")
    for label, value in lines:
        click.echo(f"  {label:<9} {value}")


def _when(ms: int, zone: ZoneInfo, now_ms: int) -> str:
    return f"{absolute(ms, zone)} ({relative(ms, now_ms)})"


def _outcome_lines(registration: Registration, now_ms: int) -> list[tuple[str, str]]:
    """Return `show`'s lines on the last outcome workers reported, and the failure streak."""
    zone = zone_of(registration.definition.cadence)
    status = registration.last_status
    if status is None:
        return [("status", "none reported yet (workers report each occurrence's outcome)")]
    text = status
    started, finished = registration.last_started_ms, registration.last_finished_ms
    if status in FINAL_STATUSES:
        if finished is not None:
            text += f", finished {_when(finished, zone, now_ms)}"
        if registration.last_duration_ms is not None:
            text += f", took {duration_text(registration.last_duration_ms)}"
    elif status == "lost":
        text += " (no word from its worker in time)"
    elif status == "retrying":
        text += " (in flight until its next attempt)"
    elif status == "running" and started is not None:
        text += f" since {_when(started, zone, now_ms)}"
    lines = [("status", text)]
    if registration.last_error:
        earlier = "" if status in ("failed", "retrying") else " (an earlier occurrence's)"
        lines.append(("error", registration.last_error + earlier))
    if registration.last_success_ms is not None:
        lines.append(("last ok", _when(registration.last_success_ms, zone, now_ms)))
    streak = str(registration.failures)
    if registration.failures:
        streak += " in a row"
    limit = registration.definition.pause_after_failures
    if limit is not None:
        streak += f" (pauses at {limit})"
    lines.append(("failures", streak))
    return lines


def _in_flight_lines(registration: Registration, now_ms: int) -> list[tuple[str, str]]:
    """Return `show`'s lines on the occurrence in flight and the slot buffered, if any."""
    zone = zone_of(registration.definition.cadence)
    lines: list[tuple[str, str]] = []
    if registration.inflight is not None:
        try:
            lease = parse_lease_member(registration.inflight)
            text = f"slot {_when(lease.due_ms, zone, now_ms)}"
            text += " (triggered)" if lease.triggered else ""
        except ValueError:  # edited by hand: show it as stored
            text = registration.inflight
        lines.append(("in flight", text))
    if registration.buffered_due_ms is not None:
        lines.append(("buffered", f"slot {_when(registration.buffered_due_ms, zone, now_ms)}"))
    return lines


def _policy_lines(registration: Registration) -> list[tuple[str, str]]:
    """Return `show`'s lines on the overlap and failure policies that are not the default."""
    lines: list[tuple[str, str]] = []
    if registration.definition.overlap != "allow":
        lines.append(("overlap", registration.definition.overlap))
    limit = registration.definition.pause_after_failures
    if limit is not None:
        failures = "failure" if limit == 1 else "consecutive failures"
        lines.append(("pause", f"after {limit} {failures}"))
    return lines


@click.command("history")
@click.argument("queue")
@click.argument("name")
@click.option(
    "-n",
    "count",
    type=click.IntRange(1, MAX_HISTORY_SIZE),
    default=20,
    show_default=True,
    help="How many occurrences, newest first (the registry keeps the last 50 by default).",
)
@json_option
@pass_settings
def history_command(settings: Settings, queue: str, name: str, count: int, as_json: bool) -> None:
    """Print the last occurrences of a schedule and what became of them, newest first.

    Each row is an occurrence: its nominal time (UTC), its status (running, succeeded,
    failed, retrying, skipped by the overlap policy, lost by a silent worker, revoked), the
    attempt, when its worker started it (the worker's clock, UTC), how long it took, its
    flags (redelivered: sent again after a crash or an expired lease; triggered: by
    `trigger`) and its error. Only occurrences workers reported, or the pump skipped or
    marked lost, are kept.

    \b
    Examples:
      emq-bridge history reports digest
      emq-bridge history reports digest -n 5 --json
    """
    repeat = settings.repeat()
    _require(repeat, queue, name)
    entries = repeat.history(queue, name, count)
    if as_json:
        click.echo(to_json([entry.to_dict() for entry in entries]))
        return
    if not entries:
        click.echo(
            f"no occurrences recorded for {queue}/{name} yet (workers report them)", err=True
        )
        return
    header = ["nominal time", "status", "attempt", "started", "duration", "flags", "error"]
    click.echo(table(header, [history_row(entry) for entry in entries]))


@click.command("next")
@click.argument("queue")
@click.argument("name")
@click.option(
    "-n",
    "count",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="How many upcoming runs.",
)
@json_option
@pass_settings
def next_command(settings: Settings, queue: str, name: str, count: int, as_json: bool) -> None:
    """Print the upcoming runs of a schedule.

    Times are in the schedule's time zone with their UTC offset, so DST changes show.

    \b
    Examples:
      emq-bridge next reports nightly -n 10
      emq-bridge next reports nightly --json
    """
    repeat = settings.repeat()
    registration = _require(repeat, queue, name)
    runs = upcoming(registration, count)  # a custom schedule's: its next check only
    now_ms = repeat.server_time_ms()
    zone = zone_of(registration.definition.cadence)
    if as_json:
        click.echo(
            to_json([{"at_ms": ms, "at": _iso(ms, zone), "in_ms": ms - now_ms} for ms in runs])
        )
        return
    if registration.paused:  # these runs happen only once it is resumed
        click.echo(
            f"{queue}/{name} is paused: nothing fires until `emq-bridge resume {queue} {name}`; "
            "the runs after that would be:",
            err=True,
        )
    for ms in runs:
        offset = _offset(ms, zone)
        click.echo(f"{absolute(ms, zone)} {offset}  ({relative(ms, now_ms)})")


def _iso(ms: int, zone: ZoneInfo) -> str:
    text = iso(ms, zone)
    assert text is not None
    return text


def _offset(ms: int, zone: ZoneInfo) -> str:
    return _iso(ms, zone)[-6:]


def _json_value(
    field: str, kind: type, what: str
) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            parsed = json.loads(value)
        except RecursionError as exc:  # json recurses once per nested array or object
            # Bad input (exit 1), as `declaration_from_entry` reports a lesser depth.
            raise ConfigError(
                f"field {field!r}: template is nested more than {MAX_TEMPLATE_DEPTH} levels deep"
            ) from exc
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}") from exc
        if not isinstance(parsed, kind):
            raise click.BadParameter(f"must be a JSON {what}")
        return parsed

    return convert


@click.command("add")
@click.argument("queue")
@click.argument("name")
@click.option(
    "--task", required=True, metavar="NAME", help="Celery task name or Dramatiq actor name."
)
@click.option(
    "--every", metavar="DURATION", help="Interval: seconds (90), or e.g. 30s, 15m, 1h30m."
)
@click.option(
    "--every-ms", type=click.IntRange(min=1), metavar="MS", help="Interval in milliseconds."
)
@click.option("--cron", metavar="EXPR", help='Cron expression, e.g. "0 9 * * 1-5" or @daily.')
@click.option("--tz", metavar="ZONE", help="IANA time zone of --cron (default UTC).")
@click.option(
    "--day-and",
    is_flag=True,
    default=None,
    help="Cron: day-of-month AND day-of-week must both match (Celery's rule).",
)
@click.option(
    "--anchor",
    type=click.Choice(ANCHORS),
    help="Interval: next = due + every (schedule, default) or now + every (release).",
)
@click.option(
    "--misfire", type=click.Choice(MISFIRES), help="Missed slots: coalesce (default) or catchup."
)
@click.option(
    "--overlap",
    type=click.Choice(OVERLAPS),
    help="A slot due while one runs: allow (default), skip, buffer_one (send it once the "
    "running one ends) or replace (send it, revoke the running one). Needs workers that "
    "report their occurrences.",
)
@click.option(
    "--pause-after-failures",
    type=click.IntRange(1, MAX_PAUSE_AFTER),
    metavar="N",
    help="Pause the schedule after N consecutive failed occurrences (default: never).",
)
@click.option(
    "--args",
    "args_",
    callback=_json_value("args", list, "array"),
    metavar="JSON",
    help="Positional args, a JSON array.",
)
@click.option(
    "--kwargs",
    callback=_json_value("kwargs", dict, "object"),
    metavar="JSON",
    help="Keyword args, a JSON object.",
)
@click.option(
    "--options",
    callback=_json_value("options", dict, "object"),
    metavar="JSON",
    help="Send options, a JSON object.",
)
@click.option("--replace", is_flag=True, help="Overwrite an existing schedule of that name.")
@framework_options(
    lambda framework: (
        f"Check --task against this {framework} application (module or "
        "module:attribute) before writing."
    )
)
@pass_settings
def add_command(settings: Settings, /, queue: str, name: str, replace: bool, **fields: Any) -> None:
    """Add a schedule at runtime.

    A schedule added here belongs to no file, so no `sync` ever removes it.

    Give one cadence: --every, --every-ms or --cron (with --tz). Without --replace an
    existing schedule of the same name is left alone: exit 0 if it is identical, else 1.
    --overlap and --pause-after-failures act on what workers report of each occurrence
    (see `show` and `history`).

    With --celery SPEC or --dramatiq SPEC (any installed adapter's option) the app is loaded
    and --task must be one of its tasks or actors, else nothing is written (exit 1).
    Without one, the name is not checked (a note on stderr says so): a pump that cannot
    send it parks the schedule, and `list`/`show` say why.

    \b
    Examples:
      emq-bridge add reports digest --task app.send_digest --every 15m --celery proj.celery:app
      emq-bridge add reports nightly --task nightly_report --cron "0 9 * * *" --tz Europe/Paris
      emq-bridge add emails retry --task retry --every 1m --kwargs '{"limit": 100}' --replace
      emq-bridge add reports sync --task sync --every 5m --overlap skip --pause-after-failures 3
    """
    given = given_frameworks(framework_params(fields))
    if len(given) > 1:
        named = " and ".join(f"--{framework}" for framework, _ in given)
        raise click.UsageError(f"give one app to check --task against, not {named}")
    entry = {"queue": queue, "name": name}
    entry.update({"args" if k == "args_" else k: v for k, v in fields.items() if v is not None})
    declaration = declaration_from_entry(entry)
    task = str(fields["task"])
    checked = _check_task(*given[0], task) if given else False
    repeat = settings.repeat()
    if replace:
        result = repeat.upsert(queue, name, definition=declaration.definition)
        click.echo(f"{result} {queue}/{name}  {declaration.definition.cadence.describe()}")
    elif repeat.register(queue, name, definition=declaration.definition) == "registered":
        click.echo(f"added {queue}/{name}  {declaration.definition.cadence.describe()}")
    else:
        existing = _require(repeat, queue, name)
        if existing.definition.digest != declaration.definition.digest:
            raise click.ClickException(
                f"{queue}/{name} already exists with a different definition "
                f"({existing.definition.cadence.describe()}); add --replace to overwrite it"
            )
        click.echo(f"exists {queue}/{name} (identical; nothing written)")
    if not given:
        options = " SPEC or ".join(f"--{framework}" for framework in targets.frameworks())
        hint = f" (give {options} SPEC to check it against the app)" if options else ""
        click.echo(f"note: task {task!r} was not checked{hint}", err=True)
    elif not checked:
        click.echo(
            f"note: the {given[0][0]} adapter cannot check task names; {task!r} was not checked",
            err=True,
        )


def _check_task(framework: str, spec: str, task: str) -> bool:
    """Load the app at `spec` through its adapter and make sure it can send `task`.

    Returns False when the adapter's dispatcher cannot tell (it has no `check_task`); exits
    1 (nothing written) when the app cannot send `task`.
    """
    target = load_target(framework, spec)
    try:
        check = getattr(target.dispatcher, "check_task", None)
        if check is None:
            return False
        try:
            check(task)
        except EmqError as exc:
            raise click.ClickException(
                f"--task {task!r}: {exc} (nothing written; leave out --{framework} to add it "
                "unchecked)"
            ) from exc
        return True
    finally:
        if target.repeat is not None:
            target.repeat.close()


@click.command("remove")
@click.argument("queue")
@click.argument("name")
@pass_settings
def remove_command(settings: Settings, queue: str, name: str) -> None:
    """Remove a schedule.

    Its record, its registry entry and its in-flight leases go.

    \b
    Example:
      emq-bridge remove reports digest
    """
    if not settings.repeat().cancel(queue, name):
        raise click.ClickException(f"no registration {name!r} in queue {queue!r}")
    click.echo(f"removed {queue}/{name}")


@click.command("pause")
@click.argument("queue")
@click.argument("name")
@pass_settings
def pause_command(settings: Settings, queue: str, name: str) -> None:
    """Pause a schedule: it stops firing until resumed.

    \b
    Example:
      emq-bridge pause reports digest
    """
    changed = _lifecycle(lambda: settings.repeat().pause(queue, name))
    click.echo(f"paused {queue}/{name}" if changed else f"{queue}/{name} was already paused")


@click.command("resume")
@click.argument("queue")
@click.argument("name")
@pass_settings
def resume_command(settings: Settings, queue: str, name: str) -> None:
    """Resume a paused schedule.

    It fires again from its next future slot; slots that passed while paused are skipped.

    \b
    Example:
      emq-bridge resume reports digest
    """
    changed = _lifecycle(lambda: settings.repeat().resume(queue, name))
    click.echo(f"resumed {queue}/{name}" if changed else f"{queue}/{name} was not paused")


@click.command("trigger")
@click.argument("queue")
@click.argument("name")
@pass_settings
def trigger_command(settings: Settings, queue: str, name: str) -> None:
    """Fire a schedule once, now.

    The occurrence is a fresh one; the cadence is left alone.

    A running pump dispatches the occurrence on its next tick. Prints the occurrence id
    (the Celery task_id / Dramatiq message_id it is sent with).

    \b
    Example:
      emq-bridge trigger reports digest
    """
    occurrence = _lifecycle(lambda: settings.repeat().trigger(queue, name))
    click.echo(occurrence)
    click.echo(f"triggered {queue}/{name}; a running pump dispatches it on its next tick", err=True)


COMMANDS = (
    list_command,
    show_command,
    history_command,
    next_command,
    add_command,
    remove_command,
    pause_command,
    resume_command,
    trigger_command,
)
