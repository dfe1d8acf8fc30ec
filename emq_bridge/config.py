"""The schedule file: a TOML document that declares schedules, read into `Declaration`s.

```toml
source = "billing"            # optional ownership tag; default "file:<file name>"
queue = "reports"             # optional default queue for the entries below

[[schedule]]
name = "digest"
task = "app.tasks.send_digest"   # Celery task name or Dramatiq actor name
every = "15m"                    # or every = 900 (s), every_ms = 900000, or cron + tz
args = [1]
kwargs = { audience = "staff" }
options = { priority = 5 }
overlap = "skip"                 # while one runs: allow (default), skip, buffer_one, replace
pause_after_failures = 3         # pause after 3 consecutive failures (default: never)
offset = "5m"                    # the interval's grid shifted by 5 minutes (default: none)
start_at = 2026-03-29T09:00:00+02:00   # no run before (a TOML date-time with an offset)
end_at = "2026-12-31T18:00:00Z"        # no run after (inclusive)
limit = 10                       # at most 10 runs, then `completed`
misfire = "latest"               # after an outage: latest (default), earliest, skip, all
catchup_window = "1h"            # slots later than this are missed (default: no bound)
labels = { team = "billing" }    # tags (str -> str) to filter by; never change when it runs
```

`at = 2026-04-01T09:00:00+02:00` (or an array of them) instead of a cadence is a one-off;
`immediately = true` fires once when the schedule is created.

`jitter = "2m"` sends each slot up to 2 minutes late, by an offset hashed from the name
(jitter.py); `exclude = ["2026-12-25", "@holidays", "cron:* * * * 0,6"]` skips those slots in
the schedule's zone, where `@holidays` names a calendar of the file's `[calendars]` table,
`holidays = ["2026-12-25", "2026-12-31..2027-01-01"]`, which several schedules share
(calendars.py).

Each entry becomes a registration whose template follows the adapters' convention,
`{"task": ..., "args": [...], "kwargs": {...}, "options": {...}}`. The whole file is
validated before anything is returned, so a sync never starts from a half-valid file.
Validation errors are `ConfigError`s naming the file, the entry and the field.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .bounds import Bounds, epoch_ms, instants_ms
from .bulk import without_gc
from .cadence import ANCHORS, MISFIRES, At, Cadence, Cron, Every, parse_every, parse_every_ms
from .calendars import Calendar, resolve_exclude
from .definition import (
    MAX_PAUSE_AFTER,
    OVERLAPS,
    Declaration,
    Definition,
    catchup_window_ms,
    check_misfire,
    offset_ms,
)
from .errors import ConfigError, ScheduleError
from .jitter import parse_jitter, shape
from .keys import validate_name
from .labels import check_labels
from .registry import Repeat
from .shown import QUOTED_CHARS, clipped, shown
from .strict_json import number_error, read_json
from .sync import SyncPlan, sync
from .template import MAX_TEMPLATE_DEPTH, TaskTemplate, check_structure, check_task_name

__all__ = [
    "ENTRY_FIELDS",
    "FILE_FIELDS",
    "MAX_SCHEDULE_FILE_BYTES",
    "ScheduleFile",
    "calendars_from_table",
    "declaration_from_entry",
    "default_source",
    "load_schedule_file",
    "read_bounded",
    "read_document",
    "sync_file",
]

FILE_FIELDS = ("source", "queue", "calendars", "schedule")
"""Keys allowed at the top level of a schedule file."""
MAX_ERRORS_SHOWN = 20
"""A file's errors are one line: the first this many, then how many more."""
MAX_SCHEDULE_FILE_BYTES = 256 * 2**20
"""The largest schedule file read, 256 MiB: a file of 1,000,000 plain entries is about 150 MB
(the bench's). A larger one is refused unread, as is a path that is not a regular file."""
# A read past a file's stated size (a file of /proc states 0) asks for this much at a time.
_CHUNK_BYTES = 2**20

ENTRY_FIELDS = (
    "queue",
    "name",
    "task",
    "every",
    "every_ms",
    "cron",
    "tz",
    "day_and",
    "anchor",
    "misfire",
    "catchup_window",
    "catchup_max",
    "args",
    "kwargs",
    "options",
    "overlap",
    "pause_after_failures",
    "offset",
    "at",
    "start_at",
    "end_at",
    "limit",
    "immediately",
    "jitter",
    "exclude",
    "labels",
)
"""Keys allowed in one `[[schedule]]` entry."""
_ENTRY_FIELD_SET = frozenset(ENTRY_FIELDS)
# The keys that shape a cadence or bound it (`_shaped`, `_bounds`): an entry without any of
# them (most entries) takes the cadence as it is and no bounds, with nothing to check.
_SHAPE_KEYS = ("exclude", "jitter")
_BOUND_KEYS = ("limit", "immediately", "start_at", "end_at")
_NO_BOUNDS = Bounds()  # frozen: one for every entry without bounds keys


@dataclass(frozen=True, slots=True)
class ScheduleFile:
    """A validated schedule file: where it came from, its owner tag, and what it declares."""

    path: Path
    source: str
    declarations: tuple[Declaration, ...]

    @property
    def queues(self) -> tuple[str, ...]:
        """Return the queues the file declares schedules in, sorted."""
        return tuple(sorted({d.queue for d in self.declarations}))


class _FieldError(Exception):
    """One invalid field of one entry (internal; reported as part of a `ConfigError`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field {field!r}: {reason}")


UTF8_BOM = b"\xef\xbb\xbf"


def read_bounded(path: str | os.PathLike[str], limit_bytes: int) -> bytes:
    """Return the bytes of the regular file at `path`, reading at most `limit_bytes` + 1.

    Raise `OSError` whose `strerror` says why when the path is not a regular file (a
    directory, a FIFO, which is never waited on, a device such as /dev/zero, which would
    never end), holds more than `limit_bytes`, or cannot be read. The type is checked on the
    open file, and the bound holds whatever size the file states.
    """
    # Non-blocking: opening a FIFO with no writer would otherwise wait for one.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _file_kind(info.st_mode)
            raise OSError(errno.EINVAL, f"it is {kind}, not a regular file", os.fspath(path))
        chunks: list[bytes] = []
        total, wanted = 0, info.st_size + 1  # one read, then the end, for a file as stated
        while total <= limit_bytes:
            chunk = os.read(fd, min(max(wanted - total, _CHUNK_BYTES), limit_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit_bytes:
        limit = _size(limit_bytes)
        raise OSError(errno.EFBIG, f"it holds more than {limit}, the limit", os.fspath(path))
    return b"".join(chunks)  # one chunk (most files): that chunk, not a copy


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def _size(count: int) -> str:
    """A byte count in words: `256 MiB`, `64 KiB`, `1000 bytes`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale and count % scale == 0:
            return f"{count // scale} {unit}"
    return f"{count} bytes"


def default_source(path: str | os.PathLike[str]) -> str:
    """Return the ownership tag of a file that sets no `source`: `file:<file name>`.

    Only the base name is used, so every host syncing its copy of the file agrees.
    """
    return f"file:{Path(path).name}"


def read_document(path: str | os.PathLike[str], what: str) -> Any:
    """Return the data of the JSON (a `.json` path) or TOML file at `path`, read as a schedule
    file is: at most `MAX_SCHEDULE_FILE_BYTES`, a key given twice or nesting deeper than the
    parser's stack refused. Raise `ConfigError` naming the file (and `what` it is, "the
    schedule file") in one line when it cannot be read; nothing else is checked.
    """
    # The same document as JSON (`emq-bridge export --format json` writes one).
    kind = "JSON" if Path(path).suffix == ".json" else "TOML"
    try:
        raw = read_bounded(path, MAX_SCHEDULE_FILE_BYTES)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        if isinstance(exc, FileNotFoundError) and not Path(path).is_absolute():
            # A setting read by a process started elsewhere (a beat's `emq_bridge_schedule_file`)
            reason = f"{reason} (a relative path, looked for from {Path.cwd()})"
        raise ConfigError(f"{os.fspath(path)}: cannot read {what}: {reason}") from exc
    try:
        if kind == "JSON":
            # NaN and Infinity are read, as TOML's nan and inf, for the entry's check to
            # refuse naming the entry and field; nesting past the stack is refused below.
            return read_json(raw, finite=False)
        # A UTF-8 byte order mark (some editors write one) is read as JSON reads it.
        return tomllib.loads(raw.removeprefix(UTF8_BOM).decode("utf-8"))
    except RecursionError as exc:  # both parsers recurse once per nested array or table
        raise ConfigError(
            f"{os.fspath(path)}: nested too deeply to read; a template holds arrays and tables "
            f"nested at most {MAX_TEMPLATE_DEPTH} levels deep"
        ) from exc
    except ValueError as exc:  # malformed, not UTF-8, a key twice, an integer too long
        raise ConfigError(f"{os.fspath(path)}: not valid {kind}: {number_error(exc)}") from exc


@without_gc
def load_schedule_file(path: str | os.PathLike[str]) -> ScheduleFile:
    """Read and validate the schedule file at `path`; raise `ConfigError` if anything is wrong.

    Every entry is checked before this returns; the error message names the file, the
    entry (`schedule #2 (reports/digest)`) and the field, and lists every invalid entry.
    Nothing is written anywhere.
    """
    if not os.fspath(path):  # Path("") is ".", the current directory
        raise ConfigError("the schedule file's path is empty: give the path of a file")
    file_path = Path(path)
    data = read_document(file_path, "the schedule file")
    if not isinstance(data, dict):
        raise ConfigError(f"{file_path}: a schedule file is one JSON object, got {_kind(data)}")
    return _parse(data, file_path)


def sync_file(
    repeat: Repeat, path: str | os.PathLike[str], *, prune: bool = True, dry_run: bool = False
) -> SyncPlan:
    """Load the schedule file at `path` and sync it into `repeat` under the file's source tag.

    Raises `ConfigError` (and writes nothing) when the file is invalid, and
    `RegistryUnavailable` when Redis cannot be reached.
    """
    schedule_file = load_schedule_file(path)
    return sync(
        repeat, schedule_file.declarations, schedule_file.source, prune=prune, dry_run=dry_run
    )


def declaration_from_entry(
    entry: Mapping[str, Any],
    *,
    default_queue: str | None = None,
    calendars: Mapping[str, Calendar] | None = None,
) -> Declaration:
    """Validate one schedule entry (the keys of a `[[schedule]]` table) into a `Declaration`.

    Raises `ConfigError` naming the entry and the field. The CLI's `add` uses this, so a
    schedule added by hand obeys the file's schema. `calendars` are what `@name` in
    `exclude` refers to.
    """
    try:
        if default_queue is not None:
            default_queue = _name(default_queue, "queue")
        return _declaration(entry, default_queue, calendars)
    except _FieldError as exc:
        queue, name = entry.get("queue", default_queue), entry.get("name")
        label = (
            f"schedule {_brief(queue)}/{_brief(name)}"
            if isinstance(queue, str) and isinstance(name, str)
            else "schedule"
        )
        raise ConfigError(f"{label}, {exc}") from exc


def _parse(data: Mapping[str, Any], path: Path) -> ScheduleFile:
    unknown = sorted(set(data) - set(FILE_FIELDS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(FILE_FIELDS)} (entries go in [[schedule]] tables)"
        )
    source = data.get("source", default_source(path))
    try:
        if not isinstance(source, str):
            raise ScheduleError(f"must be a string, got {_kind(source)}")
        validate_name(source, "source")
    except ScheduleError as exc:
        hint = "" if "source" in data else '; set source = "..." in the file'
        raise ConfigError(f"{path}: field 'source': {exc}{hint}") from exc
    raw_queue = data.get("queue")
    default_queue: str | None = None
    if raw_queue is not None:
        try:
            default_queue = _name(raw_queue, "queue")
        except _FieldError as exc:
            raise ConfigError(f"{path}: top-level {exc}") from exc
    calendars = _calendars(data.get("calendars", {}), path)
    entries = data.get("schedule", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{path}: 'schedule' must be an array of tables, written [[schedule]]")

    errors: list[str] = []
    declarations: list[Declaration] = []
    seen: dict[tuple[str, str], int] = {}
    for number, entry in enumerate(entries, start=1):
        try:
            declaration = _declaration(entry, default_queue, calendars)
        except _FieldError as exc:
            errors.append(f"{_label(number, entry, default_queue)}, {exc}")
            continue
        key = (declaration.queue, declaration.name)
        if key in seen:
            errors.append(
                f"{_label(number, entry, default_queue)}, field 'name': duplicate of schedule "
                f"#{seen[key]} in queue {key[0]!r}"
            )
            continue
        seen[key] = number
        declarations.append(declaration)
    if errors:
        shown_errors = errors[:MAX_ERRORS_SHOWN]
        if len(errors) > MAX_ERRORS_SHOWN:
            shown_errors.append(f"and {len(errors) - MAX_ERRORS_SHOWN} more")
        raise ConfigError(f"{path}: " + "; ".join(shown_errors))
    return ScheduleFile(path, source, tuple(declarations))


def _label(number: int, entry: Mapping[str, Any], default_queue: object) -> str:
    queue, name = entry.get("queue", default_queue), entry.get("name")
    if isinstance(queue, str) and isinstance(name, str):
        return f"schedule #{number} ({_brief(queue)}/{_brief(name)})"
    if isinstance(name, str):
        return f"schedule #{number} ({_brief(name)})"
    return f"schedule #{number}"


def _brief(name: str) -> str:
    """A name as an error line shows it: cut to 80 characters (the rules allow 200 bytes)."""
    return name if len(name) <= QUOTED_CHARS else f"{name[:QUOTED_CHARS]}…"


def _kind(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "an empty string" if value == "" else "a string",
        list: "an array",
        dict: "a table",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """Quote a string (clipped); name the kind of anything else, which may be big or deeply
    nested."""
    return clipped(value) if isinstance(value, str) else _kind(value)


# Seconds past this are refused by every duration field (the longest, `every`, allows 1000
# years: about 3.2e10 s). Checked first: a float cannot hold an integer of over 308 digits.
_MAX_SECONDS = 10**15


def _in_range(field: str, value: object) -> None:
    """Refuse a whole number of seconds far past any duration's limit (and past a float's)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_SECONDS:
        amount = shown(value)  # a huge one is named by its size: "a 13288-bit integer"
        unit = " of seconds" if amount.startswith("a ") else " seconds"
        raise _FieldError(field, f"is out of range: {amount}{unit}")


def _name(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise _FieldError(field, f"must be a string, got {_kind(value)}")
    try:
        return validate_name(value, field)
    except ScheduleError as exc:
        raise _FieldError(field, str(exc)) from exc


def calendars_from_table(table: object) -> dict[str, Calendar]:
    """Return the calendars of a `[calendars]` table (name -> list of exclusion rules);
    raise `ScheduleError` naming the calendar that is not one."""
    if not isinstance(table, dict):
        raise ScheduleError(f"[calendars] must be a table of name = [rules], got {_kind(table)}")
    found: dict[str, Calendar] = {}
    for name, rules in table.items():
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ScheduleError(f"calendar {name!r} must be an array of rule strings")
        try:
            found[name] = Calendar(name, rules)
        except ScheduleError as exc:
            raise ScheduleError(f"calendar {name!r}: {exc}") from None
    return found


def _calendars(table: object, path: Path) -> dict[str, Calendar]:
    try:
        return calendars_from_table(table)
    except ScheduleError as exc:
        raise ConfigError(f"{path}: field 'calendars': {exc}") from exc


def _shaped(
    entry: Mapping[str, Any], cadence: Cadence, calendars: Mapping[str, Calendar] | None
) -> Cadence:
    """The cadence less what `exclude` lists, jittered by `jitter` (calendars.py, jitter.py)."""
    if not any(key in entry for key in _SHAPE_KEYS):
        return cadence
    raw = entry.get("exclude", [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
        odd = raw if not isinstance(raw, list) else next(x for x in raw if not isinstance(x, str))
        where = "" if odd is raw else "an array holding "
        raise _FieldError("exclude", f"must be an array of rule strings, got {where}{_kind(odd)}")
    try:
        rules, names = resolve_exclude(raw, calendars)
    except ScheduleError as exc:
        raise _FieldError("exclude", str(exc)) from exc
    value = entry.get("jitter")
    if isinstance(value, bool) or not isinstance(value, int | float | str | None):
        raise _FieldError("jitter", f"must be seconds or a string like '2m', got {_kind(value)}")
    _in_range("jitter", value)
    try:
        jitter_ms = parse_jitter(value)
        tz = cadence.tz if isinstance(cadence, Cron) else "UTC"
        shaped = shape(cadence, tz=tz, exclude=rules, calendars=names, jitter_ms=jitter_ms)
        if rules:
            # Exclusions that leave no run are refused here, naming the field, as the
            # registry would refuse them: before a sync writes anything of the file (an
            # `immediately` run does not spare it: the registry asks for a run after it).
            # On this host's clock: the registry checks again on the server's.
            shaped.first_run(time.time_ns() // 1_000_000)
        return shaped
    except ScheduleError as exc:
        raise _FieldError("jitter" if "jitter" in str(exc) else "exclude", str(exc)) from exc


def _declaration(
    entry: Mapping[str, Any],
    default_queue: str | None,
    calendars: Mapping[str, Calendar] | None = None,
) -> Declaration:
    unknown = sorted(key for key in entry if key not in _ENTRY_FIELD_SET)
    if unknown:
        field = unknown[0]
        others = f" (and {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else ""
        raise _FieldError(field, f"unknown key{others}; allowed: {', '.join(ENTRY_FIELDS)}")
    if "queue" in entry:
        queue = _name(entry["queue"], "queue")
    elif default_queue is None:
        raise _FieldError("queue", 'missing; give queue = "..." here or at the top of the file')
    else:
        queue = default_queue  # checked by the caller, once for all entries
    if "name" not in entry:
        raise _FieldError("name", "missing")
    name = _name(entry["name"], "name")
    task = entry.get("task")
    if task is None:
        raise _FieldError("task", "missing; give the Celery task name or the Dramatiq actor name")
    if not isinstance(task, str) or not task.strip():
        raise _FieldError("task", f"must be a non-empty string, got {_kind(task)}")
    try:
        check_task_name(task)
    except ScheduleError as exc:
        raise _FieldError("task", str(exc)) from exc
    cadence = _shaped(entry, _cadence(entry), calendars)
    bounds = _bounds(entry, cadence)
    misfire = entry.get("misfire", "coalesce")
    if misfire not in MISFIRES:
        raise _FieldError("misfire", f"must be one of {', '.join(MISFIRES)}, got {_shown(misfire)}")
    window, most = _catchup(entry, misfire)
    overlap = entry.get("overlap", "allow")
    if overlap not in OVERLAPS:
        raise _FieldError("overlap", f"must be one of {', '.join(OVERLAPS)}, got {_shown(overlap)}")
    pause_after = _pause_after(entry.get("pause_after_failures"))
    labels = _labels(entry.get("labels"))
    calls = {field: _json(entry, field, kind) for field, kind in _CALL_FIELDS}
    template = TaskTemplate(task, calls["args"], calls["kwargs"], calls["options"])
    try:
        definition = Definition(
            cadence,
            template.to_dict(),
            misfire,
            overlap,
            pause_after,
            bounds=bounds,
            catchup_window_ms=window,
            catchup_max=most,
            labels=labels,
        )
    except ScheduleError as exc:
        # Which field holds what the template refused, checked only now: a valid entry's
        # arguments are encoded once, by the definition.
        for field, value in calls.items():
            _check_json(field, value)
        raise _FieldError("args/kwargs/options", str(exc)) from exc
    return Declaration(queue, name, definition)


def _catchup(entry: Mapping[str, Any], misfire: str) -> tuple[int | None, int | None]:
    """Check `catchup_window` (seconds or a string like "10m") and `catchup_max` (a whole
    number, with misfire = "all")."""
    if "catchup_window" not in entry and "catchup_max" not in entry:
        return None, None  # the misfire policy was checked; none needs either
    raw = entry.get("catchup_window")
    if isinstance(raw, bool) or not isinstance(raw, int | float | str | None):
        wanted = 'must be seconds or a string like "10m"'
        raise _FieldError("catchup_window", f"{wanted}, got {_kind(raw)}")
    _in_range("catchup_window", raw)
    try:
        window = catchup_window_ms(raw)
    except ScheduleError as exc:
        raise _FieldError("catchup_window", str(exc)) from exc
    most = entry.get("catchup_max")
    try:
        check_misfire(misfire, window, most)
    except ScheduleError as exc:
        raise _FieldError("catchup_max", str(exc)) from exc
    return window, most


def _pause_after(value: object) -> int | None:
    """Check `pause_after_failures`: absent (never pause) or a whole number of failures."""
    if value is None:
        return None
    wanted = f"must be a whole number of failures from 1 to {MAX_PAUSE_AFTER}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _FieldError("pause_after_failures", f"{wanted}, got {_kind(value)}")
    if not 1 <= value <= MAX_PAUSE_AFTER:
        hint = "; leave it out to never pause" if value <= 0 else ""
        raise _FieldError("pause_after_failures", f"{wanted}, got {value}{hint}")
    return value


def _labels(value: object) -> dict[str, str]:
    """Check `labels`: absent, or a table of string keys to string values (labels.py)."""
    if value is not None and not isinstance(value, dict):
        wanted = 'must be a table like { team = "billing" }'
        raise _FieldError("labels", f"{wanted}, got {_kind(value)}")
    try:
        return check_labels(value)
    except ScheduleError as exc:
        raise _FieldError("labels", str(exc)) from exc


def _instant(entry: Mapping[str, Any], field: str) -> int | None:
    """An instant field: a TOML offset date-time, or an ISO 8601 string with an offset."""
    if field not in entry:
        return None
    value = entry[field]
    if not isinstance(value, datetime | str):
        raise _FieldError(field, f"must be a date-time with an offset, got {_kind(value)}")
    try:
        return epoch_ms(value, field, ceil=field == "start_at")  # nothing runs before a start
    except ScheduleError as exc:
        raise _FieldError(field, str(exc)) from exc


def _bounds(entry: Mapping[str, Any], cadence: Cadence) -> Bounds:
    if not any(key in entry for key in _BOUND_KEYS):
        return _NO_BOUNDS  # its check applies to any cadence
    limit = entry.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise _FieldError("limit", f"must be a whole number of runs, got {_kind(limit)}")
    immediately = entry.get("immediately", False)
    if not isinstance(immediately, bool):
        raise _FieldError("immediately", f"must be true or false, got {_kind(immediately)}")
    start, end = _instant(entry, "start_at"), _instant(entry, "end_at")
    try:
        bounds = Bounds(start, end, limit, immediately)
        bounds.check(cadence)
    except ScheduleError as exc:
        message = str(exc)  # the field it is about is the first it names
        named = [f for f in ("start_at", "end_at", "limit", "immediately") if f in message]
        raise _FieldError(min(named, key=message.index, default="end_at"), message) from exc
    return bounds


def _at(entry: Mapping[str, Any]) -> Cadence:
    value = entry["at"]
    values = value if isinstance(value, list) else [value]
    for item in values:
        if not isinstance(item, datetime | str):
            raise _FieldError("at", f"must be date-times with an offset, got {_kind(item)}")
    try:
        return At(instants_ms(values))
    except ScheduleError as exc:
        raise _FieldError("at", str(exc)) from exc


def _offset(entry: Mapping[str, Any], every_ms: int) -> int:
    value = entry.get("offset")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float | str | datetime):
        raise _FieldError("offset", f"must be seconds or a string like '5m', got {_kind(value)}")
    _in_range("offset", value)
    try:
        return offset_ms(value, every_ms)
    except ScheduleError as exc:
        raise _FieldError("offset", str(exc)) from exc


def _cadence(entry: Mapping[str, Any]) -> Cadence:
    given = [k for k in ("every", "every_ms", "cron", "at") if k in entry]
    if not given:
        raise _FieldError(
            "every",
            'no cadence; give one of every = "15m", every_ms = 900000, cron = "..." or at = ...',
        )
    if len(given) > 1:
        raise _FieldError(
            given[1], f"give only one of every, every_ms, cron and at (got {' and '.join(given)})"
        )
    if "offset" in entry and given[0] not in ("every", "every_ms"):
        raise _FieldError("offset", "applies to interval schedules (every) only")
    if given[0] == "at":
        for field in ("tz", "day_and", "anchor"):
            if field in entry:
                raise _FieldError(field, "does not apply to at (one-off instants)")
        return _at(entry)
    if "cron" not in entry:
        if "tz" in entry:
            raise _FieldError("tz", "applies to cron schedules only; an interval has no time zone")
        if "day_and" in entry:
            raise _FieldError("day_and", "applies to cron schedules only; an interval has no days")
        anchor = entry.get("anchor", "grid")
        if anchor not in ANCHORS:
            raise _FieldError(
                "anchor", f"must be one of {', '.join(ANCHORS)}, got {_shown(anchor)}"
            )
        field = given[0]
        value = entry[field]
        if field == "every_ms" and (isinstance(value, bool) or not isinstance(value, int)):
            raise _FieldError(
                field, "must be an integer number of milliseconds; use every for '15m'"
            )
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise _FieldError(
                field, f"must be seconds (a number) or a string like '15m', got {_kind(value)}"
            )
        if field == "every":  # every_ms is milliseconds, read without a float
            _in_range(field, value)
        try:
            # A bare number is seconds for `every`, as in Celery; milliseconds for `every_ms`.
            every_ms = parse_every(value) if field == "every" else parse_every_ms(int(value))
        except ScheduleError as exc:
            raise _FieldError(field, str(exc)) from exc
        try:
            return Every(every_ms, anchor, _offset(entry, every_ms))
        except ScheduleError as exc:
            raise _FieldError("offset", str(exc)) from exc
    if "anchor" in entry:
        raise _FieldError(
            "anchor", "applies to interval schedules only; a cron is a wall-clock position"
        )
    expr, tz, day_and = entry["cron"], entry.get("tz", "UTC"), entry.get("day_and", False)
    if not isinstance(expr, str):
        raise _FieldError("cron", f'must be a string such as "0 9 * * *", got {_kind(expr)}')
    if not isinstance(tz, str):
        raise _FieldError("tz", f'must be a string such as "Europe/Paris", got {_kind(tz)}')
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: 'Europe' is a directory
        raise _FieldError(
            "tz", f"unknown time zone {tz!r}; use an IANA name such as 'Europe/Paris'"
        ) from exc
    if not isinstance(day_and, bool):
        raise _FieldError("day_and", f"must be true or false, got {_kind(day_and)}")
    try:
        return Cron(expr, tz, day_and)
    except ScheduleError as exc:
        raise _FieldError("cron", str(exc)) from exc


# The template's call fields of an entry, and the kind each must be.
_CALL_FIELDS = (("args", list), ("kwargs", dict), ("options", dict))


def _json(entry: Mapping[str, Any], field: str, kind: type) -> Any:
    """Return the entry's `field` (empty if absent) if it is of `kind`; its content is
    checked with the whole template (`_check_json` says which field is at fault)."""
    value = entry.get(field, kind())
    if not isinstance(value, kind):
        wanted = "an array" if kind is list else "a table"
        raise _FieldError(field, f"must be {wanted}, got {_kind(value)}")
    return value


def _check_json(field: str, value: Any) -> None:
    """Raise `_FieldError` naming `field` if its value cannot be a template's JSON."""
    if not value:  # most entries' options, many kwargs: nothing to check
        return
    try:  # before json.dumps, which recurses once per level
        check_structure({field: value})  # the field is level 2 of the template
    except ScheduleError as exc:
        raise _FieldError(field, str(exc)) from exc
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except TypeError as exc:  # "Object of type datetime is not JSON serializable"
        raise _FieldError(
            field, f"holds a value JSON cannot carry (dates and times are not allowed): {exc}"
        ) from exc
    except ValueError as exc:  # allow_nan=False: nan, inf or -inf (a cycle is too deep above)
        raise _FieldError(field, "holds a NaN or infinite number, which JSON cannot carry") from exc
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: a JSON "\ud800", invalid argv bytes
        surrogate = exc.object[exc.start]
        raise _FieldError(
            field, f"holds a string that is not valid UTF-8 (a lone surrogate, {surrogate!r})"
        ) from exc
