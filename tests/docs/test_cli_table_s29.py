"""docs/schedules-and-cli.md's command table covers every `emq-bridge` command and option.

The README says that page covers every command, so the table is checked against the click
group itself, walked, never a hard-coded list: a command added to `emq_bridge.cli` without a
row, or an option added without being named in its row, fails here.

- Every command, and every subcommand of a group (`import redbeat`), has a row whose first
  cell (the backticked usage) starts with its name.
- Every option of it (`--help` aside) is named in that cell by one of its long names
  (`--prune/--no-prune` is one option; `--prefix` and its alias `--redbeat-prefix` too; an
  option without a long name, `-n`, by a short one).
  A row whose usage would be unreadable may instead say `(options: see [..](page.md))`: its
  options must then be named on that page.
- The sentence "Its shape is `emq-bridge ...`" names every global option (`-v` counts).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from emq_bridge.cli import cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "schedules-and-cli.md"
SECTION = "## The `emq-bridge` command"
HEADER = "| command | what it does |"
SEE_ALSO = re.compile(r"\(options: see \[[^\]]*\]\(([\w.-]+\.md)[^)]*\)\)")


def commands(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every leaf command of `group`, by its full name (`import redbeat`)."""
    for name, command in sorted(group.commands.items()):
        full = f"{path}{name}"
        if isinstance(command, click.Group):
            yield from commands(command, f"{full} ")
        else:
            yield full, command


def options(command: click.Command) -> list[click.Option]:
    """The options shown in `--help` (click adds `--help` itself, outside `params`)."""
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


def names(option: click.Option, *, long_only: bool) -> list[str]:
    """The names a document may use: any, or the long ones (the short ones if it has none)."""
    every = [*option.opts, *option.secondary_opts]
    long = [n for n in every if n.startswith("--")]
    return long if long_only and long else every


def named_in(name: str, text: str) -> bool:
    """`name` occurs in `text` as a whole option (`--sync` is not in `--no-sync`)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def table_rows() -> list[tuple[str, str]]:
    """(first cell, whole line) of each row of the section's command table."""
    section = PAGE.read_text(encoding="utf-8").split(SECTION, 1)[1]
    table = section.split(HEADER, 1)[1].splitlines()[2:]  # past the header's `| --- |` line
    rows = []
    for line in table:
        if not line.startswith("|"):
            break
        cell = re.match(r"\| `([^`]*)` \|", line)
        assert cell, f"a row of the command table does not open with a `usage` cell: {line}"
        rows.append((cell.group(1).replace("\\|", "|"), line))
    return rows


def row_of(name: str, rows: list[tuple[str, str]]) -> tuple[str, str] | None:
    for usage, line in rows:
        if usage == name or usage.startswith(f"{name} "):
            return usage, line
    return None


def where_options_are(usage: str, line: str) -> tuple[str, str]:
    """(what to call it, its text): the row's usage, or the page its `(options: see ...)` names."""
    see = SEE_ALSO.search(line)
    if see is None:
        return "its row", usage
    return see.group(1), (DOCS / see.group(1)).read_text(encoding="utf-8")


COMMANDS = list(commands(cli))


def test_the_walk_finds_the_commands() -> None:
    """Guards the walk itself: a group's subcommands are reached, under their full names."""
    found = {name for name, _ in COMMANDS}
    assert {"add", "pump", "import redbeat", "import django-celery-beat"} <= found


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_command_has_a_row_naming_its_options(name: str, command: click.Command) -> None:
    row = row_of(name, table_rows())
    assert row is not None, f"{PAGE.name}'s command table has no row for `{name}`"
    where, text = where_options_are(*row)
    missing = [
        option.opts[0]
        for option in options(command)
        if not any(named_in(n, text) for n in names(option, long_only=True))
    ]
    assert not missing, f"`{name}`: {where} does not name {', '.join(missing)}"


def test_the_shape_names_every_global_option() -> None:
    text = PAGE.read_text(encoding="utf-8")
    shape = re.search(r"Its shape is\s+`(emq-bridge [^`]*)`", text)
    assert shape, f"{PAGE.name} lost its sentence 'Its shape is `emq-bridge ...`'"
    missing = [
        option.opts[0]
        for option in options(cli)
        if not any(named_in(n, shape.group(1)) for n in names(option, long_only=False))
    ]
    assert not missing, f"the command's shape does not name {', '.join(missing)}"


def test_the_redis_url_help_names_every_scheme_the_page_accepts() -> None:
    """`--redis-url`'s help lists the URL forms the page says it takes (`rediss+...` for TLS)."""
    text = PAGE.read_text(encoding="utf-8")
    paragraph = text.split("A registry URL, here and everywhere", 1)[1].split("speak TLS", 1)[0]
    schemes = set(re.findall(r"`([a-z+]+)://", paragraph))
    assert {"redis", "unix", "redis+sentinel", "redis+cluster"} <= schemes
    option = next(p for p in cli.params if p.name == "redis_url")
    assert isinstance(option, click.Option) and option.help
    missing = [
        scheme
        for scheme in sorted(schemes)
        if f"{scheme}://" not in option.help and not scheme.startswith("rediss+")
    ]
    tls = any(scheme.startswith("rediss+") for scheme in schemes)
    assert not missing, f"--redis-url's help leaves out {', '.join(missing)}"
    assert not tls or "rediss+" in option.help, "--redis-url's help leaves out rediss+..."
