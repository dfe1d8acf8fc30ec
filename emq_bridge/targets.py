"""Framework targets: how `emq-bridge pump --<framework> SPEC` finds an adapter.

An adapter makes itself known through the `emq_bridge.targets` entry-point group: the
entry point's name is the framework (it becomes the `--<name>` option), its value a
`TargetLoader`, e.g. in the adapter's `pyproject.toml`::

    [project.entry-points."emq_bridge.targets"]
    rq = "emq_bridge_rq.target:load_target"

emq-bridge's own Celery and Dramatiq adapters are registered the same way, so the CLI
names no framework, and a third one (RQ, taskiq, arq) needs no change to it. Entry points
are read from the installed package metadata; a loader's module (which imports its
framework) is imported only when its option is used.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import traceback
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol

from .dispatch import PumpTarget
from .errors import ConfigError, EmqError, ScheduleError

__all__ = [
    "ENTRY_POINT_GROUP",
    "TargetLoader",
    "app_failed",
    "declared_at",
    "frameworks",
    "load_target",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "emq_bridge.targets"
# A framework name becomes a command-line option: keep it one.
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class TargetLoader(Protocol):
    """Loads the application named by `spec` and returns what a pump needs to serve it.

    `pipelined=True` asks for the adapter's opt-in fast path; an adapter without one
    raises `ConfigError`. Raises `ConfigError` (or `ImportError`) when `spec` is wrong.
    """

    def __call__(self, spec: str, *, pipelined: bool = False) -> PumpTarget: ...


@functools.cache
def frameworks() -> Mapping[str, EntryPoint]:
    """Return the registered frameworks by name, sorted; an unusable name is logged, skipped.

    Read once per process: the installed distributions do not change while it runs.
    """
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if not _NAME.match(entry_point.name):
            log.warning(
                "framework target %r (%s) ignored: a name must be lowercase letters, digits "
                "and dashes",
                entry_point.name,
                entry_point.value,
            )
            continue
        found.setdefault(entry_point.name, entry_point)
    return dict(sorted(found.items()))


def load_target(framework: str, spec: str, *, pipelined: bool = False) -> PumpTarget:
    """Return the pump target of `spec` through the adapter registered as `framework`.

    Raises `ConfigError` for an unknown framework or a bad `spec`, and `ImportError` when
    the adapter's framework is not installed.
    """
    entry_point = frameworks().get(framework)
    if entry_point is None:
        known = ", ".join(frameworks()) or "none"
        raise ConfigError(f"no framework target {framework!r} is installed (installed: {known})")
    loader: TargetLoader = entry_point.load()
    target = loader(spec, pipelined=pipelined)
    if not isinstance(target, PumpTarget):
        raise ConfigError(
            f"the {framework} target {entry_point.value} returned {type(target).__name__}, "
            "not a PumpTarget"
        )
    return target


def app_failed(what: str, exc: Exception) -> ConfigError:
    """The one-line error of an application whose own code raised while an adapter loaded
    it (`what`: "cannot load the Celery app 'proj'"); its traceback goes to the DEBUG log
    (`-vv`), not to the user's terminal."""
    log.debug("%s", what, exc_info=exc)
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and not isinstance(cause, EmqError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__  # Celery's find_app wraps it
    if cause is not None and not isinstance(cause, EmqError):
        cause = None
    if cause is not None:  # emq-bridge refused a declaration: its reason, and where
        return ConfigError(f"{what}: {declared_at(cause)}")
    return ConfigError(f"{what}: {type(exc).__name__}: {exc} (-vv shows the traceback)")


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def declared_at(exc: EmqError) -> EmqError:
    """`exc` (raised by emq-bridge while an adapter imported the application: a bad
    `@recurring`, say), naming where in the application's code: the innermost frame of its
    traceback outside emq-bridge and Python's import machinery, "(at proj/tasks.py:12)".
    A one-line error names no file otherwise."""
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or path.startswith(_PACKAGE + os.sep):
            continue
        where = frame
    if where is None or type(exc) not in (ConfigError, ScheduleError):
        return exc
    shown = os.path.relpath(where.filename)
    if shown.startswith(".."):  # outside the working directory: the whole path
        shown = where.filename
    return type(exc)(f"{exc} (at {shown}:{where.lineno})")
