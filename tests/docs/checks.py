"""How each kind of block is checked: Python executed, TOML loaded, shell run, layout compared."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emq_bridge.config import load_schedule_file
from emq_bridge.errors import ConfigError

from .blocks import Block, prose_lines

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
COMMAND_TIMEOUT_S = 60
# The Redis URLs a snippet may name for "your local Redis"; they run against the doc server.
LOCAL_REDIS = re.compile(r"redis://(?:localhost|127\.0\.0\.1)(?::\d+)?(?:/\d+)?")
# What moves between two runs of a command: clock times, relative delays, occurrence ids.
VOLATILE = (
    (
        re.compile(
            r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?"
            r"(?: ?(?:[A-Z]{2,5}|[+-]\d\d:?\d\d)\b)*"
        ),
        "<time>",
    ),
    (re.compile(r"\b(?:in )?\d+ (?:days?|h|min|s)\b(?: ago)?"), "<delay>"),
    (re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b"), "<id>"),
)


class BlockFailed(AssertionError):
    """A block did not do what the document shows; the message says what differed."""


@dataclass
class Context:
    """What a block runs against: the repository, the document's directory, the server."""

    root: Path
    workdir: Path
    redis_url: Callable[[], str]  # starts the doc server on first use
    namespace: dict[str, Any]  # the Python globals shared by a chain of blocks


def with_server_url(text: str, context: Context) -> str:
    return LOCAL_REDIS.sub(lambda _: context.redis_url(), text)


def write_file(block: Block, context: Context) -> None:
    """Write a `file=` block into the working directory, as a reader would save it."""
    target = context.workdir / block.marker.options["file"]
    target.write_text(with_server_url(block.text, context), encoding="utf-8")


# -- python -----------------------------------------------------------------------------


def run_python(block: Block, context: Context) -> None:
    # Leading newlines keep the document's line numbers in tracebacks.
    source = "\n" * block.line + with_server_url(block.text, context)
    code = compile(source, str(context.root / block.document), "exec")
    with (
        _working_dir(context.workdir),
        _environment(REDIS_URL=context.redis_url()),
        _framework_globals_kept(),
    ):
        exec(code, context.namespace)


@contextlib.contextmanager
def _working_dir(path: Path) -> Iterator[None]:
    """Run in `path` with it importable, as `python` run from there would be."""
    before = Path.cwd()
    os.chdir(path)
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))
        os.chdir(before)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _framework_globals_kept() -> Iterator[None]:
    """Restore Dramatiq's global broker and Celery's current app, which snippets replace.

    Snippets are written as user code (`dramatiq.set_broker`, `Celery("proj")`); the rest
    of the suite must not inherit their broker or app.
    """
    dramatiq_broker = sys.modules.get("dramatiq.broker")
    broker = getattr(dramatiq_broker, "global_broker", None)
    celery_state = sys.modules.get("celery._state")
    apps = (
        (celery_state.default_app, getattr(celery_state._tls, "current_app", None))
        if celery_state
        else (None, None)
    )
    try:
        yield
    finally:
        if "dramatiq.broker" in sys.modules:
            sys.modules["dramatiq.broker"].global_broker = broker
        if "celery._state" in sys.modules:
            state = sys.modules["celery._state"]
            state.default_app, state._tls.current_app = apps


# -- toml -------------------------------------------------------------------------------


def check_toml(block: Block, context: Context) -> None:
    """Load a schedule file (or, with `parse-only`, just parse the TOML)."""
    if "parse-only" in block.marker:
        tomllib.loads(block.text)
        return
    name = block.marker.options.get("file", f"block-{block.line}.toml")
    path = context.workdir / name
    if "file" not in block.marker.options:  # a `file=` block is written before it runs
        path.write_text(block.text, encoding="utf-8")
    if "invalid" not in block.marker:
        loaded = load_schedule_file(path)
        if not loaded.declarations:
            raise BlockFailed(f"{block.where}: the schedule file declares no schedule")
        return
    try:
        load_schedule_file(path)
    except ConfigError as refused:
        expected = block.marker.options.get("error", "")
        if expected not in str(refused):
            message = f"{block.where}: expected {expected!r} in the error: {refused}"
            raise BlockFailed(message) from refused
    else:
        raise BlockFailed(f"{block.where}: marked `invalid`, but the file loads")


# -- shell ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    expected: tuple[str, ...]  # the output lines the document shows


def commands(block: Block) -> list[Command]:
    """Split a block into commands: `$ ` lines of a console block, every line of a script."""
    lines = block.text.splitlines()
    if block.lang == "console":
        return _console_commands(block, lines)
    found = []
    for offset, text in _joined(lines):
        if text.strip() and not text.lstrip().startswith("#"):
            found.append(Command(block.line + 1 + offset, text, ()))
    return found


def _joined(lines: list[str]) -> Iterator[tuple[int, str]]:
    """Yield (offset, line) with backslash continuations joined onto their first line."""
    offset = 0
    while offset < len(lines):
        start, text = offset, lines[offset]
        while text.endswith("\\") and offset + 1 < len(lines):
            offset += 1
            text = text[:-1] + lines[offset]
        yield start, text
        offset += 1


def _console_commands(block: Block, lines: list[str]) -> list[Command]:
    found: list[Command] = []
    for offset, text in _joined(lines):
        if text.startswith("$ "):
            found.append(Command(block.line + 1 + offset, text[2:], ()))
        elif not found:
            raise BlockFailed(f"{block.where}: output before the first `$ ` command")
        else:
            last = found[-1]
            found[-1] = Command(last.line, last.text, (*last.expected, text))
    return found


def run_shell(block: Block, context: Context) -> None:
    """Run each command in the working directory; check exit codes and the output shown."""
    _require_tools(block)
    found = commands(block)
    if not found:
        raise BlockFailed(f"{block.where}: no command to run")
    expected_exit = int(block.marker.options.get("exit", "0"))
    for index, command in enumerate(found):
        wanted = expected_exit if index == len(found) - 1 else 0
        _run_command(block, command, wanted, context)


def _require_tools(block: Block) -> None:
    """Fail in CI, skip elsewhere, when a tool the block calls is not installed."""
    for tool in filter(None, block.marker.options.get("requires", "").split(",")):
        if shutil.which(tool) is None:
            message = f"{block.where} needs {tool!r}, which is not installed"
            if IN_CI:
                pytest.fail(message + " (CI=true: it must be)", pytrace=False)
            pytest.skip(message)


def shell_environment(context: Context) -> dict[str, str]:
    """This interpreter's scripts first on PATH (emq-bridge, celery, ...), REDIS_URL set."""
    scripts = str(Path(sys.executable).parent)
    path = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "REDIS_URL": context.redis_url()}


def _run_command(block: Block, command: Command, wanted: int, context: Context) -> None:
    text = with_server_url(command.text, context)
    done = subprocess.run(
        ["bash", "-c", text],
        cwd=context.workdir,
        env=shell_environment(context),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    where = f"{block.document}:{command.line}: $ {command.text}"
    shown = [with_server_url(line, context) for line in command.expected]
    missing = missing_lines(shown, done.stdout, done.stderr)
    problems = [f"not in the output: {line}" for line in missing]
    if done.returncode != wanted:
        problems.insert(0, f"exit code {done.returncode}, expected {wanted}")
    if problems:
        raise BlockFailed(
            "\n".join([where, *problems]) + f"\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
        )


def normalized(line: str) -> str:
    """Return `line` with volatile parts replaced by placeholders and spacing collapsed."""
    for pattern, placeholder in VOLATILE:
        line = pattern.sub(placeholder, line)
    return " ".join(line.split())


def missing_lines(shown: list[str], stdout: str, stderr: str) -> list[str]:
    """Return the shown lines the command did not print (on stdout or stderr).

    Order is not compared: `list` sorts by next run, which moves with the clock. Lines the
    document leaves out are allowed; each printed line matches one shown line at most.
    """
    printed = Counter(normalized(line) for line in (stdout + stderr).splitlines())
    missing = []
    for line in shown:
        key = normalized(line)
        if not key:
            continue
        if printed[key]:
            printed[key] -= 1
        else:
            missing.append(line)
    return missing


# -- layout -----------------------------------------------------------------------------


def check_layout(block: Block, context: Context) -> None:
    """Check that every file and folder a layout block lists exists in the repository."""
    top, *entries = [line for line in block.text.splitlines() if line.strip()]
    package = context.root / top.strip()
    missing = []
    for entry in entries:
        name = entry.split()[0]
        path = package / name
        if not path.exists() or path.is_dir() != name.endswith("/"):
            missing.append(f"{top.strip()}{name}")
    if missing:
        raise BlockFailed(f"{block.where}: listed but not in the repository: {', '.join(missing)}")


# -- links ------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def broken_links(document: Path) -> list[str]:
    """Return the relative links of `document` whose file, or heading, does not exist."""
    broken = []
    for number, line in prose_lines(document):
        for found in LINK.finditer(line):
            target = found["target"]
            if "://" in target or target.startswith("mailto:"):
                continue
            file_part, _, heading = target.partition("#")
            path = (document.parent / file_part) if file_part else document
            if not path.exists():
                broken.append(f"{document.name}:{number}: {target}: no such file")
            elif heading and path.suffix == ".md" and heading not in heading_slugs(path):
                broken.append(f"{document.name}:{number}: {target}: no such heading")
    return broken


def heading_slugs(document: Path) -> set[str]:
    """Return the anchors GitHub gives the headings of `document`."""
    slugs = set()
    for _, line in prose_lines(document):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return slugs


CHECKS: dict[str, Callable[[Block, Context], None]] = {
    "python": run_python,
    "toml": check_toml,
    "shell": run_shell,
    "layout": check_layout,
}
