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
```

Each entry becomes a registration whose template follows the adapters' convention,
`{"task": ..., "args": [...], "kwargs": {...}, "options": {...}}`. The whole file is
validated before anything is returned, so a sync never starts from a half-valid file.
Validation errors are `ConfigError`s naming the file, the entry and the field.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .cadence import ANCHORS, MISFIRES, Cadence, Cron, Every, parse_every, parse_every_ms
from .definition import MAX_PAUSE_AFTER, OVERLAPS, Declaration, Definition
from .errors import ConfigError, ScheduleError
from .keys import validate_name
from .registry import Repeat
from .sync import SyncPlan, sync
from .template import MAX_TEMPLATE_DEPTH, TaskTemplate, check_structure

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "ENTRY_FIELDS",
    "FILE_FIELDS",
    "ScheduleFile",
    "declaration_from_entry",
    "default_source",
    "load_schedule_file",
    "sync_file",
]

FILE_FIELDS = ("source", "queue", "schedule")
"""Keys allowed at the top level of a schedule file."""

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
    "args",
    "kwargs",
    "options",
    "overlap",
    "pause_after_failures",
)
"""Keys allowed in one `[[schedule]]` entry."""


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


def default_source(path: str | os.PathLike[str]) -> str:
    """Return the ownership tag of a file that sets no `source`: `file:<file name>`.

    Only the base name is used, so every host syncing its copy of the file agrees.
    """
    return f"file:{Path(path).name}"


def load_schedule_file(path: str | os.PathLike[str]) -> ScheduleFile:
    """Read and validate the schedule file at `path`; raise `ConfigError` if anything is wrong.

    Every entry is checked before this returns; the error message names the file, the
    entry (`schedule #2 (reports/digest)`) and the field, and lists every invalid entry.
    Nothing is written anywhere.
    """
    file_path = Path(path)
    try:
        with file_path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(
            f"{file_path}: cannot read the schedule file: {exc.strerror or exc}"
        ) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file_path}: not valid TOML: {exc}") from exc
    except RecursionError as exc:  # tomllib recurses once per nested array or table
        raise ConfigError(
            f"{file_path}: nested too deeply to read; a template holds arrays and tables "
            f"nested at most {MAX_TEMPLATE_DEPTH} levels deep"
        ) from exc
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
    entry: Mapping[str, Any], *, default_queue: str | None = None
) -> Declaration:
    """Validate one schedule entry (the keys of a `[[schedule]]` table) into a `Declaration`.

    Raises `ConfigError` naming the entry and the field. The CLI's `add` uses this, so a
    schedule added by hand obeys the file's schema.
    """
    try:
        return _declaration(entry, default_queue)
    except _FieldError as exc:
        queue, name = entry.get("queue", default_queue), entry.get("name")
        label = (
            f"schedule {queue}/{name}"
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
    default_queue = data.get("queue")
    if default_queue is not None:
        try:
            _name(default_queue, "queue")
        except _FieldError as exc:
            raise ConfigError(f"{path}: top-level {exc}") from exc
    entries = data.get("schedule", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{path}: 'schedule' must be an array of tables, written [[schedule]]")

    errors: list[str] = []
    declarations: list[Declaration] = []
    seen: dict[tuple[str, str], int] = {}
    for number, entry in enumerate(entries, start=1):
        label = _label(number, entry, default_queue)
        try:
            declaration = _declaration(entry, default_queue)
        except _FieldError as exc:
            errors.append(f"{label}, {exc}")
            continue
        key = (declaration.queue, declaration.name)
        if key in seen:
            errors.append(
                f"{label}, field 'name': duplicate of schedule #{seen[key]} in queue {key[0]!r}"
            )
            continue
        seen[key] = number
        declarations.append(declaration)
    if errors:
        raise ConfigError(f"{path}: " + "; ".join(errors))
    return ScheduleFile(path, source, tuple(declarations))


def _label(number: int, entry: Mapping[str, Any], default_queue: object) -> str:
    queue, name = entry.get("queue", default_queue), entry.get("name")
    if isinstance(queue, str) and isinstance(name, str):
        return f"schedule #{number} ({queue}/{name})"
    if isinstance(name, str):
        return f"schedule #{number} ({name})"
    return f"schedule #{number}"


def _kind(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """Quote a string; name the kind of anything else, which may be big or deeply nested."""
    return repr(value) if isinstance(value, str) else _kind(value)


def _name(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise _FieldError(field, f"must be a string, got {_kind(value)}")
    try:
        return validate_name(value, field)
    except ScheduleError as exc:
        raise _FieldError(field, str(exc)) from exc


def _declaration(entry: Mapping[str, Any], default_queue: object) -> Declaration:
    unknown = sorted(set(entry) - set(ENTRY_FIELDS))
    if unknown:
        field = unknown[0]
        others = f" (and {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else ""
        raise _FieldError(field, f"unknown key{others}; allowed: {', '.join(ENTRY_FIELDS)}")
    if "queue" not in entry and default_queue is None:
        raise _FieldError("queue", 'missing; give queue = "..." here or at the top of the file')
    queue = _name(entry.get("queue", default_queue), "queue")
    if "name" not in entry:
        raise _FieldError("name", "missing")
    name = _name(entry["name"], "name")
    task = entry.get("task")
    if task is None:
        raise _FieldError("task", "missing; give the Celery task name or the Dramatiq actor name")
    if not isinstance(task, str) or not task.strip():
        raise _FieldError("task", f"must be a non-empty string, got {_kind(task)}")
    cadence = _cadence(entry)
    misfire = entry.get("misfire", "coalesce")
    if misfire not in MISFIRES:
        raise _FieldError("misfire", f"must be one of {', '.join(MISFIRES)}, got {_shown(misfire)}")
    overlap = entry.get("overlap", "allow")
    if overlap not in OVERLAPS:
        raise _FieldError("overlap", f"must be one of {', '.join(OVERLAPS)}, got {_shown(overlap)}")
    pause_after = _pause_after(entry.get("pause_after_failures"))
    template = TaskTemplate(
        task,
        _json(entry, "args", list, []),
        _json(entry, "kwargs", dict, {}),
        _json(entry, "options", dict, {}),
    )
    try:
        definition = Definition(cadence, template.to_dict(), misfire, overlap, pause_after)
    except ScheduleError as exc:
        raise _FieldError("args/kwargs/options", str(exc)) from exc
    return Declaration(queue, name, definition)


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


def _cadence(entry: Mapping[str, Any]) -> Cadence:
    given = [k for k in ("every", "every_ms", "cron") if k in entry]
    if not given:
        raise _FieldError(
            "every", 'no cadence; give one of every = "15m", every_ms = 900000, or cron = "..."'
        )
    if len(given) > 1:
        raise _FieldError(
            given[1], f"give only one of every, every_ms and cron (got {' and '.join(given)})"
        )
    if "cron" not in entry:
        for field in ("tz", "day_and"):
            if field in entry:
                raise _FieldError(
                    field, "applies to cron schedules only; an interval has no time zone"
                )
        anchor = entry.get("anchor", "schedule")
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
        try:
            # A bare number is seconds for `every`, as in Celery; milliseconds for `every_ms`.
            every_ms = parse_every(value) if field == "every" else parse_every_ms(int(value))
            return Every(every_ms, anchor)
        except ScheduleError as exc:
            raise _FieldError(field, str(exc)) from exc
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


def _json(entry: Mapping[str, Any], field: str, kind: type, default: Any) -> Any:
    value = entry.get(field, default)
    if not isinstance(value, kind):
        wanted = "an array" if kind is list else "a table"
        raise _FieldError(field, f"must be {wanted}, got {_kind(value)}")
    try:  # before json.dumps, which recurses once per level
        check_structure({field: value})  # the field is level 2 of the template
    except ScheduleError as exc:
        raise _FieldError(field, str(exc)) from exc
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _FieldError(
            field, f"holds a value JSON cannot carry (dates and times are not allowed): {exc}"
        ) from exc
    return value
