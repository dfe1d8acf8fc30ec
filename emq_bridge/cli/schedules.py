"""Commands on registrations: list, show, history, next, add, remove, pause, resume, trigger."""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import click

from .. import targets
from ..bounds import MAX_LIMIT
from ..cadence import (
    ANCHORS,
    DEFAULT_CATCHUP_MAX,
    MAX_CATCHUP_MAX,
    MISFIRES,
    SKIP_GRACE_MS,
    misfire_policy,
)
from ..config import declaration_from_entry
from ..definition import MAX_PAUSE_AFTER, OVERLAPS
from ..dispatch import PumpTarget
from ..errors import ConfigError, CorruptRecord, EmqError, ScheduleError, UnknownRegistration
from ..health import served, unserved
from ..keys import parse_lease_member
from ..labels import matches, parse_filter, parse_selector
from ..outcome import FINAL_STATUSES, MAX_HISTORY_SIZE, STATUSES
from ..registry import CorruptRecords, Registration, Repeat
from ..shown import printable
from ..strict_json import JsonInputError, read_json
from ..sync import IMPORT_SOURCE_PREFIX
from ..template import MAX_TEMPLATE_DEPTH
from ..utf8 import check_pause_texts
from .calendars import read_calendars, run_notes
from .context import Settings, client_address, given_as, pass_settings
from .frameworks import framework_options, framework_params, given_frameworks, load_target
from .health import UNSERVED_TEXT, flagged_state
from .render import (
    UNSCHEDULED_TEXT,
    absolute,
    cadence_text,
    completed_text,
    duration_text,
    history_row,
    iso,
    last_error_text,
    last_run_text,
    next_run_text,
    registration_json,
    relative,
    state_text,
    status_text,
    table,
    table_lines,
    to_json,
    unscheduled_fix,
    upcoming,
    zone_of,
)

__all__ = ["COMMANDS"]

T = TypeVar("T")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
# `list --limit` and `--offset` at most: past any registry, and far from Redis's 64-bit
# integers (ZRANGE) and Python's slices (sys.maxsize), where a larger one would fail.
MAX_PAGE = 1_000_000_000


def _selector(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, str]:
    """Return repeated `--label KEY=VALUE` options as a mapping (usage error if malformed)."""
    try:
        return parse_selector(value, "--label")
    except ScheduleError as exc:
        raise click.BadParameter(str(exc)) from exc


def _label_filter(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> dict[str, str]:
    """`--label` filters (`labels.parse_filter`): a key no schedule can have (empty, with
    whitespace) is bad usage, not a filter that matches nothing."""
    try:
        return parse_filter(value, "--label")
    except ScheduleError as exc:
        raise click.BadParameter(str(exc)) from exc


def _lifecycle(move: Callable[[], T]) -> T:
    """Run a registry move that raises KeyError for an unknown name; exit 1 with its reason.

    A registration whose record is corrupt (edited by hand) is bad input too: exit 1, in
    one line that says so (not the exit 3 of a server that refuses a command)."""
    try:
        return move()
    except UnknownRegistration:
        raise  # `emq_errors` says it, and where it looked
    except KeyError as exc:
        raise click.ClickException(
            str(exc.args[0]) if exc.args else "no such registration"
        ) from exc
    except (ScheduleError, CorruptRecord) as exc:  # a bad note, by or source: nothing written
        raise click.ClickException(str(exc)) from exc


def _require(repeat: Repeat, queue: str, name: str) -> Registration:
    """The registration `name`: exit 1 if there is none or its record is corrupt."""
    return _lifecycle(lambda: repeat.read(queue, name))


def _way_out(queue: str, name: str) -> str:
    """What an operator does with a corrupt record: `add --replace` and `sync` compare the
    definition's digest, which an edit by hand leaves as it was, so they do not rewrite it;
    `remove` works on any record."""
    remove = shlex.join(["emq-bridge", "remove", queue, name])
    return (
        f"run `{remove}`, then add it again or sync its file (add --replace and sync rewrite "
        "only a changed definition)"
    )


def _corruption(exc: CorruptRecord) -> str:
    """Why a record is corrupt, naming the field, without the API's advice."""
    return str(exc.__cause__ or exc)


def _corrupt(repeat: Repeat, queue: str, name: str) -> CorruptRecord | None:
    """The `CorruptRecord` a read of `name` raises, or None (sound, or gone)."""
    try:
        repeat.read(queue, name)
    except CorruptRecord as exc:
        return exc
    except KeyError:
        return None
    return None


@click.command("list")
@click.argument("queue", required=False)
@json_option
@click.option(
    "--limit",
    type=click.IntRange(0, MAX_PAGE),
    help="Show at most this many schedules (a page).",
)
@click.option(
    "--offset",
    type=click.IntRange(0, MAX_PAGE),
    default=0,
    show_default=True,
    help="Skip this many schedules first (the next page: --offset 50 --limit 50).",
)
@click.option(
    "--label",
    "selector",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_label_filter,
    help="Only schedules with this label; repeat it: all must match (paging counts those).",
)
@pass_settings
def list_command(
    settings: Settings,
    queue: str | None,
    as_json: bool,
    limit: int | None,
    offset: int,
    selector: dict[str, str],
) -> None:
    """List schedules with their cadence, next and last run, last status, and state.

    Without QUEUE, list every queue under the prefix, queue by queue; each queue's schedules
    come in next-run order (paused last). The next run is shown in the schedule's time zone
    (UTC for intervals) and relative to the Redis server's clock. The records are read and
    printed a thousand at a time, so a registry of any size lists in bounded memory.
    The state is active, paused, or parked with the start of its reason: a dispatch that can
    never work, such as an unknown actor, or a streak of failures (--pause-after-failures)
    stopped it until it is resumed; unserved when its next run passed and no live pump
    serves its queue (see `emq-bridge pumps`), so nothing will fire it. The last status is
    what workers reported of the last occurrence (`-` if none reported yet): running,
    succeeded, failed (with the streak), retrying, skipped, lost or revoked. --label keeps
    the schedules whose labels hold every KEY=VALUE given.

    \b
    Examples:
      emq-bridge list
      emq-bridge list reports --limit 50 --offset 50
      emq-bridge list --label team=billing --label tier=gold
      emq-bridge list reports --json | jq '.[].next_run'
    """
    repeat = settings.repeat()
    queues = [queue] if queue is not None else repeat.queues(broken=True)
    now_ms = repeat.server_time_ms()
    pumped = served(repeat, queues)
    if selector:
        registrations = _labelled(repeat, queues, selector, offset, limit)
    else:
        registrations = _page(repeat, queues, offset, limit)
    if as_json:
        items = (
            registration_json(r, now_ms, unserved=unserved(r, now_ms, pumped))
            for r in registrations
        )
        for chunk in _json_array(items):
            click.echo(chunk, nl=False)
        click.echo()
        return
    rows = (
        [
            r.queue,
            r.name,
            cadence_text(r),
            next_run_text(r, now_ms),
            last_run_text(r, now_ms),
            status_text(r),
            flagged_state(r, now_ms, pumped, state_text(r)),
        ]
        for r in registrations
    )
    header = ["queue", "name", "cadence", "next run", "last run", "last status", "state"]
    shown = False
    for line in table_lines(header, rows):  # as they are read: the first lines come at once
        click.echo(line)
        shown = True
    if not shown:
        where = f" in queue {queue!r}" if queue is not None else ""
        if selector:
            where += " with labels " + ",".join(f"{k}={v}" for k, v in selector.items())
        page = " on this page" if offset else ""
        # Where it looked: the commands read $REDIS_URL, which may not be the app's server.
        click.echo(f"no schedules{where}{page} at {settings.where}", err=True)


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


def _labelled(
    repeat: Repeat, queues: list[str], selector: dict[str, str], offset: int, limit: int | None
) -> Iterator[Registration]:
    """Yield the registrations of `queues` whose labels match `selector`, paged after the
    match (labels are in the records, not indexed: every record is read, streamed)."""
    found = (
        r
        for queue in queues
        for r in repeat.iter_list(queue)
        if matches(r.definition.labels, selector)
    )
    stop = None if limit is None else offset + limit
    yield from itertools.islice(found, offset, stop)


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
    the overlap policy skipped and the occurrences a worker skipped, `lost` the occurrences
    whose worker went silent), what is in flight or buffered, its policies, owner and
    template. `history` lists the occurrences.

    \b
    Examples:
      emq-bridge show reports digest
      emq-bridge show reports digest --json
    """
    repeat = settings.repeat()
    registration = _require(repeat, queue, name)
    now_ms = repeat.server_time_ms()
    flagged = unserved(registration, now_ms, served(repeat, [queue]))
    data = registration_json(registration, now_ms, unserved=flagged)
    if as_json:
        click.echo(to_json(data))
        return
    zone = zone_of(registration.definition.cadence)
    last = "never"
    fired_ms = registration.last_fired_ms
    if fired_ms is not None:
        last = f"{absolute(fired_ms, zone)} ({relative(fired_ms, now_ms)})"
    state = data["state"] if not data["unserved"] else UNSERVED_TEXT
    if data["state"] == "unscheduled":
        state = UNSCHEDULED_TEXT
    if registration.completed is not None:
        state = completed_text(registration)
    if registration.parked_ms is not None:
        since = registration.parked_ms
        state += f" since {absolute(since, zone)} ({relative(since, now_ms)})"
    lines = [
        ("cadence", data["cadence"]),
        ("state", state),
    ]
    if data["state"] == "unscheduled":  # its record is there, its registry member is not
        lines.append(("", unscheduled_fix(registration)))
    if registration.parked_reason is not None:
        lines.append(("reason", registration.parked_reason))
        lines.append(("", f"fix it, then: emq-bridge resume {queue} {name}"))
    lines += _pause_lines(registration, now_ms)
    lines += [
        ("next run", next_run_text(registration, now_ms)),
        ("last run", last),
        *_outcome_lines(registration, now_ms),
        ("fired", str(registration.fired)),
        ("missed", str(registration.missed)),
        ("skipped", str(registration.skipped)),
        ("lost", str(registration.lost)),
        *_dropped_lines(registration),
        *_in_flight_lines(registration, now_ms),
        ("misfire", _misfire_text(registration)),
        *_policy_lines(registration),
        *_bounds_lines(registration, now_ms),
        *_labels_lines(registration),
        ("source", registration.source or "(added at runtime)"),
        ("template", json.dumps(data["template"])),  # in its stored order: a reorder is a change
    ]
    click.echo(f"{queue}/{name}")
    for label, value in lines:  # a note or an error from outside stays on its line
        click.echo(f"  {label:<9} {printable(value)}")


def _dropped_lines(registration: Registration) -> list[tuple[str, str]]:
    """Return `show`'s line on the backfilled slots dropped unsent (none if there are none)."""
    dropped = registration.backfill_dropped
    if not dropped:
        return []
    return [("dropped", f"{dropped} backfilled slot(s) the schedule no longer has, unsent")]


def _pause_lines(registration: Registration, now_ms: int) -> list[tuple[str, str]]:
    """Return `show`'s lines on a pause: its note, who paused it and when."""
    if not registration.paused or registration.parked_reason is not None:
        return []
    zone = zone_of(registration.definition.cadence)
    who = registration.paused_by or "(not recorded)"
    if registration.paused_ms is not None:
        who += f", {_when(registration.paused_ms, zone, now_ms)}"
    lines = [("paused by", who)]
    if registration.paused_note:
        lines.append(("note", registration.paused_note))
    return lines


def _misfire_text(registration: Registration) -> str:
    """Return the misfire policy as `show` says it: the policy, its window and bound."""
    definition = registration.definition
    text: str = definition.misfire
    policy = misfire_policy(definition.misfire)
    if policy != text:
        text += f" (= {policy})"
    window = definition.catchup_window_ms
    if window is None and policy == "skip":
        window = SKIP_GRACE_MS
    text += ", window " + (duration_text(window) if window is not None else "none")
    if policy == "all":
        text += f", at most {definition.catchup_max or DEFAULT_CATCHUP_MAX} per catch-up"
    return text


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
        text += " (not started in time, or no word from its worker in time)"
    elif status == "retrying":
        text += " (in flight until its next attempt)"
    elif status == "running" and started is not None:
        text += f" since {_when(started, zone, now_ms)}"
    lines = [("status", text)]
    error = last_error_text(registration)
    if error:
        lines.append(("error", error))
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


def _bounds_lines(registration: Registration, now_ms: int) -> list[tuple[str, str]]:
    """Return `show`'s lines on the bounds (start, end, limit) and completion, if any."""
    zone = zone_of(registration.definition.cadence)
    bounds = registration.definition.bounds
    lines: list[tuple[str, str]] = []
    if bounds.start_ms is not None:
        lines.append(("start at", _when(bounds.start_ms, zone, now_ms)))
    if bounds.end_ms is not None:
        lines.append(("end at", _when(bounds.end_ms, zone, now_ms)))
    if bounds.limit is not None:
        left = "?" if registration.remaining is None else str(registration.remaining)
        lines.append(("limit", f"{bounds.limit} runs, {left} remaining"))
    if registration.completed is not None and registration.completed_ms is not None:
        lines.append(("completed", _when(registration.completed_ms, zone, now_ms)))
    return lines


def _labels_lines(registration: Registration) -> list[tuple[str, str]]:
    """Return `show`'s line on the labels, `key=value` sorted by key, if it has any."""
    labels = registration.definition.labels
    if not labels:
        return []
    return [("labels", ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))]


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
@click.option(
    "--status",
    "statuses",
    type=click.Choice(STATUSES),
    multiple=True,
    help="Only occurrences of this status (repeat it for several), among all those kept.",
)
@json_option
@pass_settings
def history_command(
    settings: Settings,
    queue: str,
    name: str,
    count: int,
    statuses: tuple[str, ...],
    as_json: bool,
) -> None:
    """Print the last occurrences of a schedule and what became of them, newest first.

    Each row is an occurrence: its nominal time (UTC), its status (running, succeeded,
    failed, retrying, skipped by the overlap policy, lost by a silent worker, revoked), the
    attempt, when its worker started it (the worker's clock, UTC), how long it took, its
    flags (redelivered: sent again after a crash or an expired lease; triggered: by
    `trigger`; backfill: sent by `backfill`, out of the live schedule's lifecycle) and its
    error. Only occurrences workers reported, or the pump skipped or
    marked lost, are kept.

    \b
    Examples:
      emq-bridge history reports digest
      emq-bridge history reports digest -n 5 --json
      emq-bridge history reports digest --status failed --status lost
    """
    repeat = settings.repeat()
    _require(repeat, queue, name)
    if statuses:  # a skip policy's skipped slots can fill the history: filter all it keeps
        kept = repeat.history(queue, name, MAX_HISTORY_SIZE)
        entries = [entry for entry in kept if entry.status in statuses][:count]
    else:
        entries = repeat.history(queue, name, count)
    if as_json:
        click.echo(to_json([entry.to_dict() for entry in entries]))
        return
    if not entries:
        shown = f" with status {' or '.join(statuses)}" if statuses else ""
        click.echo(
            f"no occurrences{shown} recorded for {queue}/{name} yet (workers report them)",
            err=True,
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

    Times are in the schedule's time zone with their UTC offset, so DST changes show. A
    jittered run names the slot it stands for (its nominal time and id); the slots its
    calendars skip show as excluded.

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
    notes = run_notes(registration.definition.cadence, runs, now_ms)  # jitter, calendars
    if as_json:
        click.echo(
            to_json(
                [
                    {"at_ms": ms, "at": _iso(ms, zone), "in_ms": ms - now_ms, **note}
                    for ms, note in zip(runs, notes, strict=True)
                ]
            )
        )
        return
    if registration.paused:  # these runs happen only once it is resumed
        click.echo(
            f"{queue}/{name} is paused: nothing fires until `emq-bridge resume {queue} {name}`; "
            "the runs after that would be:",
            err=True,
        )
    for ms, note in zip(runs, notes, strict=True):
        for skipped in note.get("excluded_ms", []):
            click.echo(f"{absolute(skipped, zone)} {_offset(skipped, zone)}  excluded")
        if note.get("excluded_more"):
            click.echo("...  more excluded")
        offset = _offset(ms, zone)
        slot = note.get("nominal_ms", ms)
        jittered = "" if slot == ms else f"  jittered from {absolute(slot, zone)}"
        click.echo(f"{absolute(ms, zone)} {offset}  ({relative(ms, now_ms)}){jittered}")


def _iso(ms: int, zone: ZoneInfo) -> str:
    text = iso(ms, zone)
    assert text is not None
    return text


def _offset(ms: int, zone: ZoneInfo) -> str:
    return _iso(ms, zone)[-6:]


class _TooDeep:
    """An option's JSON nested past the parser's stack: deeper than any template may be."""

    def __init__(self, field: str) -> None:
        self.field = field


def _refuse_too_deep(queue: str, name: str, fields: dict[str, Any]) -> None:
    """Raise `ConfigError` for an option `_json_value` found nested past the parser's stack,
    named as `declaration_from_entry` names one nested past `MAX_TEMPLATE_DEPTH`."""
    for value in fields.values():
        if isinstance(value, _TooDeep):
            raise ConfigError(
                f"schedule {queue}/{name}, field {value.field!r}: template is nested more "
                f"than {MAX_TEMPLATE_DEPTH} levels deep"
            )


def _json_value(
    field: str, kind: type, what: str
) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            parsed = read_json(value)  # a key given twice is refused, as in a .json file
        except RecursionError:  # json recurses once per nested array or object
            # Bad input (exit 1), as `declaration_from_entry` reports a lesser depth: the
            # command says so once it knows the schedule's name (`_refuse_too_deep`).
            return _TooDeep(field)
        except JsonInputError as exc:
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
    help="Interval: on the epoch grid (grid, default), next = now + every (release), or "
    "next = due + every from the registration instant (schedule, the old default).",
)
@click.option(
    "--offset", metavar="DURATION", help="Interval: shift the grid, e.g. 5m (:05/:20/:35/:50)."
)
@click.option(
    "--at",
    multiple=True,
    metavar="DATETIME",
    help="A one-off instant instead of a cadence, ISO 8601 with an offset "
    "(2026-04-01T09:00:00+02:00); repeat it for several.",
)
@click.option("--start-at", metavar="DATETIME", help="No run before this instant (ISO 8601).")
@click.option("--end-at", metavar="DATETIME", help="No run after this instant (inclusive).")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    metavar="N",
    help="At most N runs, then the schedule is completed (triggers do not count).",
)
@click.option(
    "--immediately", is_flag=True, default=None, help="Fire once when the schedule is created."
)
@click.option(
    "--jitter",
    metavar="DURATION",
    help="Send each slot up to this much later (30s, 5m), by an offset hashed from the "
    "name and the slot; its id and nominal time stay the slot's.",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="RULE",
    help="Skip the slots on a date (2026-12-25), a range of days (2026-12-20..2027-01-03), "
    "a window (2026-11-27T18:00..2026-11-30T06:00), a cron:<fields> match, or @NAME of "
    "--calendars, in the schedule's zone; repeat it for several.",
)
@click.option(
    "--calendars",
    "calendars_file",
    type=click.Path(),  # a directory: exit 1, as any file that cannot be read
    metavar="FILE",
    help="A TOML file whose [calendars] table names the calendars --exclude @NAME uses.",
)
@click.option(
    "--misfire",
    type=click.Choice(MISFIRES),
    help="Slots no pump claimed in time (stopped, or behind): latest (default; fire the "
    "newest once), earliest, skip (none) or all (each, at most --catchup-max); coalesce and "
    "catchup are the old names of latest and all.",
)
@click.option(
    "--catchup-window",
    metavar="DURATION",
    help="A slot later than this (30s, 10m, 2h) is missed, not fired (default: no bound; "
    "60s for skip).",
)
@click.option(
    "--catchup-max",
    type=click.IntRange(1, MAX_CATCHUP_MAX),
    metavar="N",
    help="With --misfire all: at most the newest N missed slots per catch-up (default 100).",
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
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_selector,
    help="Tag the schedule (team=billing); repeat it for several. `list --label` and the "
    "web view filter by them.",
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

    Give one cadence: --every, --every-ms, --cron (with --tz) or --at (one-off instants).
    --start-at, --end-at and --limit bound it; past them it shows as completed. Without --replace an
    existing schedule of the same name is left alone: exit 0 if it is identical, else 1.
    --replace over a schedule a source owns (a file's, an app's) makes it a runtime one,
    with a warning on stderr: that source's next sync puts its own definition back while it
    declares it, and no sync removes it once it does not.
    --overlap and --pause-after-failures act on what workers report of each occurrence
    (see `show` and `history`).

    With --celery SPEC or --dramatiq SPEC (any installed adapter's option) the app is loaded,
    the schedule goes to the app's registry (unless --redis-url, $REDIS_URL or --prefix names
    one), --task must be one of its tasks or actors, and --overlap replace needs an app that
    can revoke an occurrence that runs (a Dramatiq one cannot), else nothing is written
    (exit 1).
    Without one, the name is not checked (a note on stderr says so): a pump that cannot
    send it parks the schedule, and `list`/`show` say why.

    \b
    Examples:
      emq-bridge add reports digest --task app.send_digest --every 15m --celery proj.celery:app
      emq-bridge add reports nightly --task nightly_report --cron "0 9 * * *" --tz Europe/Paris
      emq-bridge add emails retry --task retry --every 1m --kwargs '{"limit": 100}' --replace
      emq-bridge add reports sync --task sync --every 5m --overlap skip --pause-after-failures 3
      emq-bridge add reports once --task report --at 2026-04-01T09:00:00+02:00
      emq-bridge add reports trial --task poll --every 15m --offset 5m --limit 10
      emq-bridge add reports etl --task etl --every 1h --misfire all --catchup-window 1d
      emq-bridge add reports spread --task poll --cron "H * * * *" --jitter 30s
      emq-bridge add reports audit --task audit --every 1h --label team=billing --label tier=gold
      emq-bridge add reports daily --task report --cron "0 9 * * 1-5" --tz Europe/Paris \\
          --exclude 2026-12-25 --exclude @holidays --calendars calendars.toml
    """
    given = given_frameworks(framework_params(fields))
    if len(given) > 1:
        named = " and ".join(f"--{framework}" for framework, _ in given)
        raise click.UsageError(f"give one app to check --task against, not {named}")
    _refuse_too_deep(queue, name, fields)
    entry = {"queue": queue, "name": name}
    fields["at"] = list(fields["at"]) or None  # --at may be repeated
    fields["exclude"] = list(fields["exclude"]) or None  # and --exclude
    fields["labels"] = fields["labels"] or None  # and --label (a dict from _selector)
    calendars = read_calendars(fields.pop("calendars_file"))
    entry.update({"args" if k == "args_" else k: v for k, v in fields.items() if v is not None})
    declaration = declaration_from_entry(entry, calendars=calendars)
    task = str(fields["task"])
    options = declaration.definition.template.get("options") or {}
    overlap = declaration.definition.overlap
    target = load_target(*given[0]) if given else None
    try:
        checked = False
        if target is not None:
            checked = _check_task(given[0][0], target, task, queue, options, overlap)
        repeat = _app_registry(settings, target)
    except BaseException:
        if target is not None and target.repeat is not None:
            target.repeat.close()
        raise
    if replace:
        owner = _owner(repeat, queue, name)
        result = repeat.upsert(queue, name, definition=declaration.definition)
        if owner is not None and result != "unchanged":
            click.echo(_taken_from_text(queue, name, owner), err=True)
        # A record edited by hand keeps its digest: an upsert of the same definition leaves
        # it corrupt, and saying "unchanged" would hide it.
        corrupt = _corrupt(repeat, queue, name)
        if corrupt is not None:
            done = "nothing written" if result == "unchanged" else f"its definition {result}"
            raise click.ClickException(
                f"registration {queue}/{name} is corrupt: {_corruption(corrupt)}; "
                f"--replace left it corrupt ({done}): {_way_out(queue, name)}"
            )
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
        # An add writes nothing over a record, so it does not put back a missing member.
        if existing.unscheduled and not existing.paused and existing.completed is None:
            click.echo(
                f"note: {queue}/{name} is {UNSCHEDULED_TEXT}; {unscheduled_fix(existing)}",
                err=True,
            )
    if not given:
        options = " SPEC or ".join(f"--{framework}" for framework in targets.frameworks())
        hint = f" (give {options} SPEC to check it against the app)" if options else ""
        click.echo(f"note: task {task!r} was not checked{hint}", err=True)
    elif not checked:
        click.echo(
            f"note: the {given[0][0]} adapter cannot check task names; {task!r} was not checked",
            err=True,
        )


def _owner(repeat: Repeat, queue: str, name: str) -> str | None:
    """The source that owns `name` (its record's `source`), or None: added at runtime, or
    no record. Read before `add --replace` writes, only to say what the write took over."""
    return repeat.load_records(queue, [name], ("source",))[name].get("source") or None


def _taken_from_text(queue: str, name: str, owner: str) -> str:
    """The warning of an `add --replace` that took `name` from the source `owner`: written
    with no source, it is a runtime schedule now. A sync takes over a name it declares (and
    prunes only what it owns); an import never takes over another owner's record."""
    shown = printable(owner)  # a record edited by hand may hold anything
    taken = f"warning: --replace took {queue}/{name} from source {shown} (a runtime schedule now)"
    if owner.startswith(IMPORT_SOURCE_PREFIX):
        return f"{taken}: an import run again leaves it alone"
    return (
        f"{taken}: the next sync of {shown} puts its own definition back if it still "
        f"declares {name}; if not, no sync removes it"
    )


def _app_registry(settings: Settings, target: PumpTarget | None) -> Repeat:
    """The registry `add` writes to: the app's own (where its beat or workers pump), unless
    the user named one (`--redis-url`, `$REDIS_URL`, `--prefix`); before, a schedule checked
    against the app went to the default registry, which no pump of the app reads."""
    app = target.repeat if target is not None else None
    if app is None:
        return settings.repeat()
    if given_as("redis_url") is not None or given_as("prefix") is not None:
        app.close()
        return settings.repeat()
    # Messages and the error boundary quote settings.where: the app's registry's address.
    settings.redis_url, settings.prefix = client_address(app.client), app.prefix
    click.get_current_context().call_on_close(app.close)
    return app


def _check_task(
    framework: str,
    target: PumpTarget,
    task: str,
    queue: str,
    options: Mapping[str, Any],
    overlap: str,
) -> bool:
    """Make sure the app `target` (loaded through its adapter) can send `task` from `queue`
    with the sending `options` (`--options`) under the `overlap` policy.

    Returns False when the adapter's dispatcher cannot tell (it has no `check_task`); exits
    1 (nothing written) when the app cannot send `task`, serves it from another queue (a
    dispatcher's `check_queue`), cannot route it as `options` say (its `check_options`), or
    cannot honour `overlap` (`_check_overlap`).
    """
    _check_overlap(framework, target, overlap)
    check = getattr(target.dispatcher, "check_task", None)
    if check is None:
        return False
    check_queue = getattr(target.dispatcher, "check_queue", None)
    try:
        check(task)
        if check_queue is not None:
            check_queue(task, queue)
    except EmqError as exc:
        raise click.ClickException(
            f"--task {task!r}: {exc} (nothing written; leave out --{framework} to add it unchecked)"
        ) from exc
    check_options = getattr(target.dispatcher, "check_options", None)
    if check_options is not None:
        try:
            check_options(options)
        except EmqError as exc:
            raise click.ClickException(f"--options: {exc} (nothing written)") from exc
    return True


def _check_overlap(framework: str, target: PumpTarget, overlap: str) -> None:
    """Exit 1 (nothing written) for `replace` when the app's dispatcher cannot revoke the
    occurrence that runs (it has no `revoke`, as the pump asks): Dramatiq's cannot, so
    `replace` is refused as its `recurring`, `register` and file check refuse it."""
    if overlap == "replace" and getattr(target.dispatcher, "revoke", None) is None:
        raise click.ClickException(
            f"--overlap replace is not available on {framework.capitalize()}: it cannot "
            "revoke an occurrence that runs; use --overlap skip (drop the slots that come "
            "while one runs) or buffer_one (keep one to run as soon as it ends) "
            "(nothing written)"
        )


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
        raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
    click.echo(f"removed {queue}/{name}")


@click.command("pause")
@click.argument("queue")
@click.argument("name", required=False)
@click.option("--note", help="Why it is paused; `show` says it until it is resumed.")
@click.option("--by", "by", help="Who paused it (default: none recorded).")
@click.option("--all", "every_one", is_flag=True, help="Pause every registration of QUEUE.")
@click.option("--source", help="Pause every registration of QUEUE that SOURCE owns (a sync's).")
@pass_settings
def pause_command(
    settings: Settings,
    queue: str,
    name: str | None,
    note: str | None,
    by: str | None,
    every_one: bool,
    source: str | None,
) -> None:
    """Pause a schedule (or, with --all or --source, many): it stops firing until resumed.

    A schedule whose record is corrupt (edited by hand) is paused too, with a warning that
    `resume` will refuse it until it is removed and added again.

    \b
    Examples:
      emq-bridge pause reports digest --note "mail relay down" --by alice
      emq-bridge pause reports --source billing --note "freeze until Monday"
      emq-bridge pause reports --all
    """
    _lifecycle(lambda: check_pause_texts(note, by))  # before any write: exit 1
    repeat = settings.repeat()
    if _bulk(name, every_one, source):
        paused = _lifecycle(lambda: repeat.pause_all(queue, source=source, note=note, by=by))
        click.echo(f"paused {len(paused)} in {queue}" + "".join(f"\n  {n}" for n in paused))
        return
    assert name is not None  # _bulk checked it
    changed = _lifecycle(lambda: repeat.pause(queue, name, note=note, by=by))
    click.echo(f"paused {queue}/{name}" if changed else f"{queue}/{name} was already paused")
    # A corrupt record is paused all the same (a stop needs no decoding, and one corrupt in
    # a field the pump does not read still fires); say now that `resume` will refuse it.
    corrupt = _corrupt(repeat, queue, name)
    if corrupt is not None:
        click.echo(
            f"warning: registration {queue}/{name} is corrupt: {_corruption(corrupt)}; "
            f"resume refuses it: {_way_out(queue, name)}",
            err=True,
        )


@click.command("resume")
@click.argument("queue")
@click.argument("name", required=False)
@click.option(
    "--catchup",
    is_flag=True,
    help="Hand the slots that passed while paused to the misfire policy (default: skip them).",
)
@click.option("--all", "every_one", is_flag=True, help="Resume every paused one of QUEUE.")
@click.option("--source", help="Resume every paused one of QUEUE that SOURCE owns.")
@pass_settings
def resume_command(
    settings: Settings,
    queue: str,
    name: str | None,
    catchup: bool,
    every_one: bool,
    source: str | None,
) -> None:
    """Resume a paused schedule (or, with --all or --source, many).

    It fires again from its next future slot; slots that passed while paused are skipped
    and not counted, unless --catchup hands them to its misfire policy (`latest` fires the
    newest of them, `all` each, ...; the dropped ones are counted in missed). --all and
    --source leave parked registrations (a dispatch that can never work) parked. A schedule
    whose record is corrupt (edited by hand) is not resumed (exit 1, naming the field):
    remove it, then add it again or sync its file.

    \b
    Examples:
      emq-bridge resume reports digest
      emq-bridge resume reports digest --catchup
      emq-bridge resume reports --source billing
    """
    repeat = settings.repeat()
    if _bulk(name, every_one, source):

        def resume_all() -> tuple[list[str], CorruptRecords | None]:
            try:
                return repeat.resume_all(queue, source=source, catchup=catchup), None
            except CorruptRecords as exc:  # the others were resumed
                return exc.done, exc

        resumed, failed = _lifecycle(resume_all)
        click.echo(f"resumed {len(resumed)} in {queue}" + "".join(f"\n  {n}" for n in resumed))
        if failed is not None:  # the others are resumed: exit 1, naming those left paused
            raise click.ClickException(f"{failed}; for each, {_way_out(queue, 'NAME')}")
        return
    assert name is not None  # _bulk checked it

    def resume_one() -> bool:
        try:
            return repeat.resume(queue, name, catchup=catchup)
        except CorruptRecord as exc:  # refused before any write: say why, and the way out
            raise click.ClickException(
                f"registration {queue}/{name} is corrupt: {_corruption(exc)}; resume refuses "
                f"it (nothing written): {_way_out(queue, name)}"
            ) from exc

    changed = _lifecycle(resume_one)
    click.echo(f"resumed {queue}/{name}" if changed else f"{queue}/{name} was not paused")


def _bulk(name: str | None, every_one: bool, source: str | None) -> bool:
    """True for a bulk pause/resume; a usage error (exit 2) unless exactly one of NAME,
    --all and --source is given."""
    given = [x for x, v in (("NAME", name), ("--all", every_one), ("--source", source)) if v]
    if len(given) != 1:
        raise click.UsageError(
            "give exactly one of NAME, --all or --source"
            + (f" (got {', '.join(given)})" if given else "")
        )
    return name is None


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
