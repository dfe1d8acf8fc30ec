"""The fingerprint of a schedule file, read without validating it.

`emq-bridge sync FILE` and the Celery beat's `emq_bridge_schedule_file` stamp their sync of
a file with it (`sync.Stamp`), so that a later sync of the same bytes whose stamp holds
(`sync.stamped`) neither parses, validates nor syncs the file again. The fingerprint
digests the file's bytes, its kind (JSON or TOML) and the version of the code that reads
it. The file's source is its top-level `source` key, or `file:<name>` without one, as
`load_schedule_file` reads it: from the lines before the file's first table for TOML (TOML
keeps top-level keys there; the rest of the file is what takes long to parse), from the
document for JSON (which parses quickly). A file read no other way has no fingerprint: it is
then loaded and synced in full, which says what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .config import MAX_SCHEDULE_FILE_BYTES, ScheduleFile, default_source, read_bounded
from .errors import EmqError
from .keys import validate_name
from .registry import Repeat
from .stamps import code_versions
from .sync import Stamp, queues_of, stamped

__all__ = ["FileStamp", "file_fingerprint", "file_stamp"]

# Raised when what a sync makes of the same bytes changes without a release. 2: crons with
# control characters and host zone files ('localtime') refused, an emptied file refused;
# 3: a template keeps its dicts' key order as the file gives it (earlier releases sorted
# them: the first sync of an unchanged file rewrites those templates); 4: a Dramatiq
# worker's file refuses options Dramatiq or emq-bridge write on each message (`retries`,
# `emq_*`...): an earlier release's stamp vouched for a file holding one, which the worker
# then booted over and kept sending until an unrelated edit made every worker refuse it.
FORMAT = 4
# The first table header (`[calendars]`, `[[schedule]]`): top-level keys come before it.
_FIRST_TABLE = re.compile(r"^[ \t]*\[", re.MULTILINE)


def _top_level(data: bytes, is_json: bool) -> object:
    if is_json:
        return json.loads(data)
    text = data.decode("utf-8")
    return tomllib.loads(_FIRST_TABLE.split(text, maxsplit=1)[0])


def file_fingerprint(
    path: str | os.PathLike[str], generation: int | None = None, context: str = ""
) -> tuple[str, str] | None:
    """Return `(source, fingerprint)` of the schedule file at `path` synced at `generation`
    (and `context`: what else the caller checks the file against, e.g. a broker's actors),
    or None when it cannot be read or its top-level keys do not parse (see the module)."""
    file_path = Path(path)
    is_json = file_path.suffix == ".json"
    try:
        data = read_bounded(file_path, MAX_SCHEDULE_FILE_BYTES)  # a FIFO, /dev/zero: None
        top = _top_level(data, is_json)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None  # (tomllib's and json's errors are ValueErrors)
    if not isinstance(top, dict):
        return None
    source = top.get("source", default_source(file_path))
    try:
        validate_name(source, "source")
    except EmqError:
        return None
    digest = hashlib.blake2b(digest_size=16)
    kind = "json" if is_json else "toml"
    head = (str(FORMAT), kind, str(generation), *code_versions("emq-bridge"))
    digest.update(" ".join(head).encode())
    digest.update(b"\n")
    digest.update(context.encode("utf-8", "surrogatepass"))
    digest.update(b"\n")
    digest.update(data)
    return source, digest.hexdigest()


@dataclass(frozen=True, slots=True)
class FileStamp:
    """A schedule file's fingerprint, and what its last stamped sync left when that stamp
    still holds (`queues`: the queues its schedules are in; `declared`: how many)."""

    source: str
    fingerprint: str
    queues: tuple[str, ...] | None = None
    declared: int | None = None

    @property
    def holds(self) -> bool:
        return self.queues is not None and self.declared is not None

    def stamp_for(self, loaded: ScheduleFile) -> Stamp | None:
        """The stamp of a sync of the file as `load_schedule_file` read it; None when the
        loader read another source than this fingerprint did (never: both read one key)."""
        if loaded.source != self.source:
            return None
        return Stamp.of_queues(self.fingerprint, loaded.declarations)


def file_stamp(
    repeat: Repeat,
    path: str | os.PathLike[str],
    generation: int | None = None,
    context: str = "",
) -> FileStamp | None:
    """Return the file's fingerprint and, if its last stamped sync still holds, what it left
    (`FileStamp.holds`); None when the file has no fingerprint (see the module)."""
    found = file_fingerprint(path, generation, context)
    if found is None:
        return None
    source, fingerprint = found
    left = queues_of(stamped(repeat, source, fingerprint))
    if left is None:
        return FileStamp(source, fingerprint)
    return FileStamp(source, fingerprint, *left)
