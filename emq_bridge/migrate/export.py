"""Write the registry back as a schedule file that `emq-bridge sync` reads.

Each registration becomes one `[[schedule]]` entry (queue, name, task, cadence, jitter,
exclusions, policies, bounds, args/kwargs/options) that the schedule file's parser reads
back into the same definition digest; the calendars its exclusions name become the file's
`[calendars]` table, written once however many schedules name them. Every entry is read
back through the file's own parser before it is kept, so one that would not come back the
same (a custom Celery schedule, a template that is not task/args/kwargs/options, a seed
other than its name, a definition field this module does not write, a null or an integer
beyond 64 bits in TOML) is refused with the reason, never written changed. What a file does
not hold stays in Redis: paused state, counters, history.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from tomllib import loads as _toml_loads
from typing import Any, Literal

from ..cadence import At, Cron, Every
from ..calendars import Calendar, Excluding
from ..config import declaration_from_entry
from ..errors import ConfigError, EmqError, ScheduleError
from ..jitter import Jittered
from ..keys import validate_name
from ..millis import iso_utc
from ..registry import MISSING_RECORD, Registration, Repeat, record_digest
from ..template import TaskTemplate

__all__ = ["FORMATS", "Export", "Format", "SourceLeftOut", "export_registry", "render"]

Format = Literal["toml", "json"]
FORMATS: tuple[Format, ...] = ("toml", "json")


@dataclass(slots=True)
class Export:
    """A schedule file's content, and the registrations it could not carry (and why)."""

    source: str | None
    entries: list[dict[str, Any]] = field(default_factory=list)
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # queue, name, reason
    calendars: dict[str, list[str]] = field(default_factory=dict)  # the `[calendars]` table
    # What the caller should tell (stderr): an owner not declared, a queue with nothing.
    notes: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        head: dict[str, Any] = {} if self.source is None else {"source": self.source}
        used = {i[1:] for e in self.entries for i in e.get("exclude", ()) if i.startswith("@")}
        table = {n: rules for n, rules in self.calendars.items() if n in used}
        return {**head, **({"calendars": table} if table else {}), "schedule": self.entries}


class SourceLeftOut(ConfigError):
    """An export of one source that would leave some of its schedules out (nothing is
    written). `refused` names those a file cannot carry, and why: (queue, name, reason),
    what the caller lists (`!` lines) before the error."""

    def __init__(self, message: str, refused: Iterable[tuple[str, str, str]] = ()) -> None:
        super().__init__(message)
        self.refused = list(refused)


def export_registry(
    repeat: Repeat,
    queues: Iterable[str] | None = None,
    *,
    source: str | None = None,
    fmt: Format = "toml",
) -> Export:
    """Read the registrations of `queues` (default: every queue) into an `Export`.

    With `source`, only the registrations that source owns are exported, and the file
    declares that source (its sync then owns exactly them, unchanged). Without it, the
    file declares the owner its registrations share, if they all share one; with several
    owners it declares none, and a note says that its sync takes them all over.

    A file that declares a source must hold every registration of it, in every queue: its
    sync removes the ones it leaves out. So `source` with queues that leave some of its
    registrations out (or with some it cannot carry) is a `SourceLeftOut` (a `ConfigError`
    that names those it cannot carry), and an owner merely shared is then not declared (a
    note says so).
    """
    if source is not None:
        validate_name(source, "source")  # as `pause --source` checks it
    queues = tuple(queues) if queues is not None else None
    registrations: list[Registration] = []
    corrupt: list[tuple[str, str, str]] = []  # left out, and said so: not silently dropped
    # Every queue, a broken one too: its read fails rather than leave its schedules out.
    for queue in sorted(queues if queues is not None else repeat.queues(broken=True)):
        for found, name, fields, error in repeat.iter_checked(queue):
            owner = found.source if found is not None else fields.get("source")
            if source is not None and owner != source:
                continue
            if found is None and error == MISSING_RECORD:  # a member without its record
                corrupt.append((queue, name, error))
            elif found is None:
                corrupt.append((queue, name, f"its record is corrupt: {error}"))
            else:
                registrations.append(found)
    registrations.sort(key=lambda r: (r.queue, r.name))
    owners = {r.source for r in registrations}
    owner = source if source is not None else (next(iter(owners)) if len(owners) == 1 else None)
    out = Export(owner, calendars=_calendar_table(registrations))
    table = _calendar_objects(out.calendars)
    stored = _stored(repeat, registrations)
    for registration in registrations:
        record = stored.get((registration.queue, registration.name), {})
        try:
            entry = _entry(registration, fmt, table, record)
            out.entries.append(_checked(entry, registration, table, record.get("digest")))
        except _Refused as exc:
            out.refused.append((registration.queue, registration.name, str(exc)))
    out.refused.extend(corrupt)
    paused = sum(1 for r in registrations if r.paused)
    if paused:  # a file holds definitions: a sync into another registry makes them active
        out.notes.append(
            f"note: {paused} paused schedule(s) are written as definitions only: synced into "
            "a registry that does not hold them, they are active"
        )
    pending = sum(
        1
        for r in registrations
        if isinstance(r.definition.cadence, At) and r.next_run_ms is not None
    )
    if pending:  # its runs left are instants: one past when it is synced is not run
        out.notes.append(
            f"note: {pending} one-off schedule(s) with a run still to come are written as "
            "definitions only: synced into a registry that does not hold them, a run whose "
            "time has passed by then is not sent (the schedule is complete)"
        )
    # A limit is a definition's; the runs made toward it are this registry's (`remaining`).
    spent = [r for r in registrations if _runs_made_toward_its_limit(r)]
    if spent:
        completed = sum(1 for r in spent if r.completed is not None)
        out.notes.append(
            f"note: {len(spent)} schedule(s) with a limit of runs made some of them here "
            f"({completed} completed): written as definitions only, synced into a registry "
            "that does not hold them, they run their whole limit again (a one-off imported "
            "from django-celery-beat is a limit of 1)"
        )
    for queue in sorted(set(queues or ())):
        if not any(r.queue == queue for r in registrations):
            out.notes.append(f"note: queue {queue!r} has no schedule to export")
    if owner is not None:
        _declare_only_whole(repeat, out, owner, queues, explicit=source is not None)
    elif len(owners) > 1:
        out.notes.append(_owners_note(owners))
    return out


def _owners_note(owners: set[str | None]) -> str:
    """Say that a file of several owners' schedules declares none of them, and what a sync
    of it then does: it owns every schedule it holds, under the file's own source."""
    names = sorted(repr(o) if o is not None else "none" for o in owners)
    shown = ", ".join(names[:_OWNERS_NAMED])
    if len(names) > _OWNERS_NAMED:
        shown += f" and {len(names) - _OWNERS_NAMED} more"
    unowned = (
        "; those of no owner (added at run time: the CLI, the API) are in no --source export: "
        "a file always declares an owner, so they come back owned by the file's"
        if None in owners
        else ""
    )
    return (
        f"note: these schedules have {len(names)} owners ({shown}) and the file declares none: "
        "a sync of it takes every one over to the file's source (file:<its name>); "
        f"export each owner with --source to keep them apart{unowned}"
    )


# The owners `_owners_note` names; the rest are counted.
_OWNERS_NAMED = 5


def _declare_only_whole(
    repeat: Repeat, out: Export, owner: str, queues: Iterable[str] | None, *, explicit: bool
) -> None:
    """Keep `owner` declared only if the file holds all its registrations (module rule)."""
    elsewhere = 0
    if queues is not None:
        listed = set(queues)
        elsewhere = sum(
            1
            for queue in repeat.queues()
            if queue not in listed
            for r in repeat.iter_list(queue)
            if r.source == owner
        )
    left_out = elsewhere + len(out.refused)
    if not left_out:
        return
    where = ", ".join(
        part
        for part in (
            f"{elsewhere} in queues not exported" if elsewhere else "",
            f"{len(out.refused)} this file cannot carry" if out.refused else "",
        )
        if part
    )
    if explicit:
        raise SourceLeftOut(
            f"--source {owner}: {left_out} of its schedules would be left out ({where}), "
            f"and a sync of a file that declares {owner} removes what it leaves out: export "
            "every queue, or leave out --source (nothing written)",
            out.refused,
        )
    out.source = None
    out.notes.append(
        f"note: the file does not declare source {owner!r}: {left_out} of its schedules are "
        f"left out ({where}), which a sync of it would remove"
    )


# Records read per round trip for their stored digests (as Repeat.digests does).
_CHUNK = 2000


def _stored(
    repeat: Repeat, registrations: list[Registration]
) -> dict[tuple[str, str], dict[str, str]]:
    """Return each registration's stored digest, and the fields no file declares, as Redis
    holds them: a decoded definition does not show them all (a custom Celery schedule's
    label), and the stored digest is the one a sync of the file must write again."""
    wanted = ("digest", *sorted(REFUSED_FIELDS))
    names: dict[str, list[str]] = {}
    for registration in registrations:
        names.setdefault(registration.queue, []).append(registration.name)
    found: dict[tuple[str, str], dict[str, str]] = {}
    for queue, listed in names.items():
        for start in range(0, len(listed), _CHUNK):
            chunk = listed[start : start + _CHUNK]
            for name, fields in repeat.load_records(queue, chunk, wanted).items():
                found[(queue, name)] = fields
    return found


class _Refused(Exception):
    pass


# The record fields of a definition this module writes as file keys (`_cadence`, `_timing`,
# the template, the policies); a definition with any other is refused. The round trip
# (export -> sync -> same digests) is what tests/migrate/test_export.py holds this to.
CARRIED_FIELDS = frozenset(
    {
        "every_ms",
        "anchor",
        "offset_ms",
        "cron",
        "tz",
        "day_and",
        "at",
        "misfire",
        "catchup_window",
        "catchup_max",
        "start_ms",
        "end_ms",
        "limit",
        "immediately",
        "template",
        "template_pieces",  # how a long template is stored (template_pieces.py): the template
        "overlap",
        "pause_after_failures",
        # Jitter and exclusions (`_shaping`); the seed of jitter and H is the name's.
        "jitter_ms",
        "exclude",
        "calendars",
        "seed",
        # Labels, a table of strings (`labels = { team = "billing" }`).
        "labels",
    }
)
# The definition fields no schedule file declares, and why (each is refused, never dropped).
REFUSED_FIELDS = {
    "cadence_label": "its cadence is a custom Celery schedule object, which is declared in "
    "beat_schedule (Python), not in a schedule file",
}


def _entry(
    registration: Registration,
    fmt: Format,
    calendars: dict[str, Calendar],
    record: dict[str, str],
) -> dict[str, Any]:
    definition = registration.definition
    fields = definition.to_fields()
    for name, reason in REFUSED_FIELDS.items():
        if name in fields or name in record:
            raise _Refused(reason)
    unknown = sorted(set(fields) - CARRIED_FIELDS)
    if unknown:
        raise _Refused(
            f"a schedule file cannot carry its {', '.join(unknown)}: syncing the file would "
            "change it"
        )
    seed = fields.get("seed")
    if seed is not None and seed != registration.name:
        raise _Refused(
            f"its H or jitter is seeded with {seed!r}, not its name: a schedule file seeds "
            "them with the name, so its sync would move the slots (keep define(seed=...) "
            "in Python)"
        )
    template = dict(definition.template)
    try:
        task = TaskTemplate.read(template)
    except EmqError as exc:
        raise _Refused(f"its template is not a task call: {exc}") from exc
    extra = sorted(set(template) - {"task", "args", "kwargs", "options"})
    if extra:
        raise _Refused(
            f"its template holds {', '.join(extra)} besides task/args/kwargs/options "
            "(a custom Celery schedule is declared in beat_schedule, not in a file)"
        )
    missing = [k for k in ("args", "kwargs", "options") if k not in template]
    if missing:
        raise _Refused(
            f"its template has no {', '.join(missing)} (written through the API); a file "
            "always declares them, so its sync would rewrite the template"
        )
    entry: dict[str, Any] = {"queue": registration.queue, "name": registration.name}
    entry["task"] = task.task
    base, shaping = _shaping(definition.cadence, calendars)
    entry.update(_cadence(base))
    entry.update(shaping)
    entry.update(_timing(definition))
    for key, value in (("args", task.args), ("kwargs", task.kwargs), ("options", task.options)):
        if value:
            entry[key] = _plain(value)  # plain lists and dicts, not read-only views
    if definition.overlap != "allow":
        entry["overlap"] = definition.overlap
    if definition.pause_after_failures is not None:
        entry["pause_after_failures"] = definition.pause_after_failures
    if definition.labels:
        entry["labels"] = dict(definition.labels)
    if fmt == "toml" and _holds(entry, _is_null):
        raise _Refused("it holds a null, which TOML cannot write: export it with --format json")
    if fmt == "toml" and _holds(entry, _is_wide_int):
        raise _Refused(
            "it holds an integer outside the signed 64-bit range, which TOML cannot write "
            "(a TOML parser must refuse it): export it with --format json"
        )
    if fmt == "toml" and _toml_reorders(entry):
        raise _Refused(
            "TOML would give its args, kwargs or options back with their keys in another "
            "order (a table is written after the plain keys of its object), which the task "
            "would receive: export it with --format json"
        )
    return entry


def _toml_reorders(entry: dict[str, Any]) -> bool:
    """True when the file `render` writes in TOML would read `entry`'s args, kwargs or
    options back with the keys of an object in another order: tomli-w writes the plain keys
    of a table first, then its sub-tables, so `{"n": 1, "nested": {...}, "flag": true}`
    comes back as n, flag, nested (the template keeps its order: a sync would rewrite it).
    """
    sent = {key: entry[key] for key in ("args", "kwargs", "options") if key in entry}
    if not sent or "{" not in json.dumps(sent)[1:]:  # no object inside: nothing to reorder
        return False
    try:
        import tomli_w
    except ImportError:  # `render` says what is missing
        return False
    # A table, as in the file (a `[[schedule]]` entry is too long to be written inline).
    back = _toml_loads(tomli_w.dumps({"entry": sent}))["entry"]
    return json.dumps(back) != json.dumps(sent)


def _cadence(cadence: Any) -> dict[str, Any]:
    """Return the file keys of a cadence: an interval, a cron or one-off instants."""
    out: dict[str, Any] = {}
    if isinstance(cadence, Cron):
        out["cron"], out["tz"] = cadence.expr, cadence.tz
        if cadence.day_and:
            out["day_and"] = True
    elif isinstance(cadence, Every):
        # The anchor is always written: a file's default anchor is not every version's.
        out["every_ms"], out["anchor"] = cadence.every_ms, cadence.anchor
        if getattr(cadence, "offset_ms", 0):
            out["offset"] = f"{cadence.offset_ms}ms"
    elif cadence.kind == "at" and hasattr(cadence, "instants_ms"):
        out["at"] = [_iso(ms) for ms in cadence.instants_ms]
    else:
        raise _Refused(f"its cadence ({cadence.describe()}) has no schedule-file form")
    return out


def _shaping(cadence: Any, calendars: dict[str, Calendar]) -> tuple[Any, dict[str, Any]]:
    """Return the cadence under its jitter and exclusions, and their file keys: `jitter`,
    and `exclude` naming the calendars of the file's table (`@name`) and listing the rest."""
    out: dict[str, Any] = {}
    if isinstance(cadence, Jittered):
        out["jitter"] = _duration(cadence.jitter_ms)
        cadence = cadence.inner
    if isinstance(cadence, Excluding):
        out["exclude"] = _exclude_items(cadence.rules, cadence.calendars, calendars)
        cadence = cadence.inner
    return cadence, out


def _exclusion(cadence: Any) -> Excluding | None:
    inner = cadence.inner if isinstance(cadence, Jittered) else cadence
    return inner if isinstance(inner, Excluding) else None


def _calendar_table(registrations: Iterable[Registration]) -> dict[str, list[str]]:
    """Return the rules of each calendar the registrations' exclusions name.

    A record holds the rules its calendars resolved to and their names, not which rule came
    from which calendar. A calendar's rules are taken as those every schedule naming it
    excludes, in the order of the one that names it first with the fewest rules, less those
    that in every such schedule another calendar (one more schedules name) supplies. The
    other rules of a schedule are written in its own `exclude` (`_exclude_items`). Any
    subset of what its schedules exclude gives the same digests; this one is what a file
    that declared the calendars would most likely have said. (A rule that every schedule
    naming a calendar lists by itself as well is written in the calendar.)
    """
    found: dict[str, list[Excluding]] = {}
    reference: dict[str, tuple[tuple[bool, int], tuple[str, ...]]] = {}
    for registration in registrations:
        exclusion = _exclusion(registration.definition.cadence)
        if exclusion is None:
            continue
        for position, name in enumerate(exclusion.calendars):
            found.setdefault(name, []).append(exclusion)
            rank = (position > 0, len(exclusion.rules))
            if name not in reference or rank < reference[name][0]:
                reference[name] = (rank, exclusion.rules)
    table: dict[str, list[str]] = {}
    # The calendars more schedules name are the surer ones: settled first.
    for name in sorted(found, key=lambda n: (-len(found[n]), n)):
        common = frozenset.intersection(*(frozenset(e.rules) for e in found[name]))
        supplied = frozenset.intersection(
            *(
                frozenset(r for other in e.calendars if other in table for r in table[other])
                for e in found[name]
            )
        )
        table[name] = [r for r in reference[name][1] if r in common and r not in supplied]
    return dict(sorted(table.items()))


def _calendar_objects(table: dict[str, list[str]]) -> dict[str, Calendar]:
    """The table's calendars, as the file's parser reads them (a name it refuses is left
    out, and the schedules naming it are refused)."""
    calendars: dict[str, Calendar] = {}
    for name, rules in table.items():
        try:
            calendars[name] = Calendar(name, rules)
        except ScheduleError:
            continue
    return calendars


def _exclude_items(
    rules: tuple[str, ...], names: tuple[str, ...], calendars: dict[str, Calendar]
) -> list[str]:
    """Return an `exclude` list that resolves to exactly `rules` and `names`, in order.

    Resolving expands each `@name` in place and keeps a rule's first occurrence
    (calendars.resolve_exclude); so before each calendar the rules that come before its
    own (not yet seen) rules are listed by themselves, and the rules after the last one.
    """
    items: list[str] = []
    seen: set[str] = set()
    at = 0
    for name in names:
        calendar = calendars.get(name)
        if calendar is None:
            raise _Refused(f"its calendar {name!r} cannot be declared in a schedule file")
        new = [r for r in dict.fromkeys(calendar.exclude) if r not in seen]
        while list(rules[at : at + len(new)]) != new:
            if at >= len(rules):  # a rule of the calendar this schedule does not exclude
                raise _Refused(f"its exclusions do not hold the rules of calendar {name!r}")
            items.append(rules[at])
            seen.add(rules[at])
            at += 1
            new = [r for r in new if r not in seen]
        items.append(f"@{name}")
        seen.update(new)
        at += len(new)
    items.extend(rules[at:])
    return items


def _checked(
    entry: dict[str, Any],
    registration: Registration,
    calendars: dict[str, Calendar],
    stored_digest: str | None,
) -> dict[str, Any]:
    """Return `entry` once the file's own parser reads it back into the digest stored."""
    try:
        declaration = declaration_from_entry(entry, calendars=calendars)
    except EmqError as exc:
        raise _Refused(f"a schedule file would not read it back: {exc}") from exc
    ours, theirs = registration.definition.to_fields(), declaration.definition.to_fields()
    changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if changed:
        raise _Refused(f"syncing the file would change its {', '.join(changed)}")
    if record_digest(declaration.definition, registration.source) != stored_digest:
        raise _Refused(
            "its stored digest is not the one its definition reads back as (a record field "
            "this version does not read, or it changed during the export): export it again"
        )
    return entry


def _duration(ms: int) -> str:
    """Return ms as the largest exact unit a file reads (`"2m"`, `"90s"`, `"1500ms"`)."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _timing(definition: Any) -> dict[str, Any]:
    """Return the file keys of a definition's misfire policy and bounds, where set."""
    out: dict[str, Any] = {}
    if definition.misfire != "coalesce":
        out["misfire"] = definition.misfire
    window = getattr(definition, "catchup_window_ms", None)
    if window is not None:
        out["catchup_window"] = f"{window}ms"
    if getattr(definition, "catchup_max", None) is not None:
        out["catchup_max"] = definition.catchup_max
    bounds = getattr(definition, "bounds", None)
    if bounds is not None:
        if bounds.start_ms is not None:
            out["start_at"] = _iso(bounds.start_ms)
        if bounds.end_ms is not None:
            out["end_at"] = _iso(bounds.end_ms)
        if bounds.limit is not None:
            out["limit"] = bounds.limit
        if bounds.immediately:
            out["immediately"] = True
    return out


def _iso(ms: int) -> str:
    """Return epoch ms as an ISO 8601 UTC instant (to the ms), which a file reads back."""
    return iso_utc(ms, always_ms=True)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


# The integers TOML holds: a parser must refuse one outside the signed 64-bit range (Python's
# `tomllib` reads it, other parsers do not).
_TOML_INT_MIN, _TOML_INT_MAX = -(2**63), 2**63 - 1


def _holds(value: Any, found: Callable[[Any], bool]) -> bool:
    """True when `value`, or any item of its dicts and lists however deep, is `found`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if found(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _is_null(item: Any) -> bool:
    return item is None


def _is_wide_int(item: Any) -> bool:
    """An integer TOML cannot write (`_TOML_INT_MIN`..`_TOML_INT_MAX`)."""
    return type(item) is int and not _TOML_INT_MIN <= item <= _TOML_INT_MAX


def render(export: Export, fmt: Format) -> str:
    """Return the export as the text of a schedule file in `fmt`."""
    document = export.document()
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    try:
        import tomli_w
    except ImportError as exc:
        raise ConfigError(
            "writing TOML needs tomli-w: pip install 'emq-bridge[migrate]' (or use --format json)"
        ) from exc
    return tomli_w.dumps(document)


def _runs_made_toward_its_limit(registration: Registration) -> bool:
    """Whether `registration` has a limit of runs and made some of them here."""
    limit = registration.definition.bounds.limit
    if limit is None:
        return False
    remaining = registration.remaining
    return registration.completed is not None or (remaining is not None and remaining < limit)
