"""Read the fenced code blocks of a Markdown document, each with its `doctest` marker.

A marker is an HTML comment on the last non-blank line above a fence, for example
`<!-- doctest: run exit=1 -->` or `<!-- doctest: skip reason="runs until Ctrl-C" -->`:
bare words are flags, `key="value"` pairs are options. tests/docs/README.md lists them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"^\s*<!--\s*doctest:(?P<body>.*?)-->\s*$")
FENCE_OPEN = re.compile(r"^(?P<fence>`{3,})\s*(?P<lang>[\w+-]*)")
FLAGS = frozenset({"skip", "continue", "run", "invalid", "parse-only", "layout"})
OPTIONS = frozenset({"reason", "file", "exit", "error", "requires"})
TRAILING_COMMENT = re.compile(r"\s+#.*$")
SHELL_LANGS = frozenset({"console", "bash", "sh", "shell"})
PYTHON_LANGS = frozenset({"python", "py"})


class MarkerError(ValueError):
    """A block is marked wrongly, or not marked where a marker is required."""


@dataclass(frozen=True)
class Marker:
    flags: frozenset[str] = frozenset()
    options: Mapping[str, str] = field(default_factory=dict)

    def __contains__(self, flag: object) -> bool:
        return flag in self.flags


@dataclass(frozen=True)
class Block:
    document: str  # the document's path from the repository root, e.g. "docs/celery.md"
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: Marker

    @property
    def name(self) -> str:
        return f"line-{self.line}-{self.lang or 'text'}"

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def first_line(self) -> str:
        """Return the first non-blank line without its trailing comment: the block's key."""
        line = next((line for line in self.text.splitlines() if line.strip()), "")
        return " ".join(TRAILING_COMMENT.sub("", line).split())

    @property
    def kind(self) -> str:
        """How the block is checked: skip, python, toml, shell, layout or unchecked."""
        if "skip" in self.marker:
            return "skip"
        if self.lang in PYTHON_LANGS:
            return "python"
        if self.lang == "toml":
            return "toml"
        if self.lang in SHELL_LANGS:
            return "shell"
        return "layout" if "layout" in self.marker else "unchecked"


def parse_marker(body: str, where: str) -> Marker:
    flags: set[str] = set()
    options: dict[str, str] = {}
    for word in shlex.split(body):
        key, is_option, value = word.partition("=")
        if is_option and key in OPTIONS:
            options[key] = value
        elif not is_option and word in FLAGS:
            flags.add(word)
        else:
            raise MarkerError(f"{where}: unknown doctest marker word {word!r}")
    return Marker(frozenset(flags), options)


def read_blocks(path: Path, root: Path) -> list[Block]:
    """Return the fenced blocks of the document at `path`, each checked for a usable marker."""
    document = path.relative_to(root).as_posix()
    blocks = list(_blocks(path.read_text(encoding="utf-8").splitlines(), document))
    for index, block in enumerate(blocks):
        _check_marker(block, is_first=index == 0)
    return blocks


def _blocks(lines: list[str], document: str) -> Iterator[Block]:
    marker: Marker | None = None
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        found = MARKER.match(line)
        opening = FENCE_OPEN.match(line)
        if found:
            marker = parse_marker(found["body"], f"{document}:{number}")
        elif opening:
            body, number_after = _fenced_body(lines, number, opening["fence"], document)
            yield Block(document, number, opening["lang"], body, marker or Marker())
            marker, number = None, number_after
        elif line.strip() and marker is not None:
            raise MarkerError(f"{document}:{number}: a doctest marker must sit right above a fence")


def _fenced_body(lines: list[str], start: int, fence: str, document: str) -> tuple[str, int]:
    """Return the text after the opening fence on line `start` and the line after the close."""
    for number in range(start, len(lines)):
        if lines[number].strip() == fence:
            return "\n".join(lines[start:number]) + "\n", number + 1
    raise MarkerError(f"{document}:{start}: the fence opened here is never closed")


def _check_marker(block: Block, *, is_first: bool) -> None:
    marker, kind = block.marker, block.kind
    problems = []
    if kind == "skip" and not marker.options.get("reason"):
        problems.append('`skip` needs a reason="..."')
    if kind == "shell" and "run" not in marker:
        problems.append("a shell block needs `run` (it is executed) or `skip reason=...`")
    if kind == "unchecked":
        problems.append(f"a {block.lang or 'plain'} block needs a checker (`layout`) or `skip`")
    if is_first and "continue" in marker:
        problems.append("the first block of a document has nothing to continue")
    if ("invalid" in marker or "parse-only" in marker) and kind != "toml":
        problems.append("`invalid` and `parse-only` are for toml blocks")
    if ({"exit", "requires"} & marker.options.keys()) and kind != "shell":
        problems.append("`exit` and `requires` are for shell blocks")
    if problems:
        raise MarkerError(f"{block.where}: " + "; ".join(problems))


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield the numbered lines of a document that are outside fenced blocks."""
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opening = FENCE_OPEN.match(line)
        if fence is None and opening:
            fence = opening["fence"]
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            yield number, line
