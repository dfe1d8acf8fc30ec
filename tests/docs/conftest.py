"""Every fenced block of README.md and docs/*.md is a test item; tests/docs/README.md says how.

The documents live outside tests/, so pytest reaches them through this file: pytest offers
every file of tests/docs to `pytest_collect_file`, and the hook claims this conftest.py and
returns a collector of the documents. `pytest tests/docs` and a plain `pytest` both run them.
Items are named after document and line (`docs/celery.md::line-42-python`); pick some with
`-k`, e.g. `pytest tests/docs -k "celery and line-42"`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge.embedded import EmbeddedServer

from . import checks
from .blocks import Block, MarkerError, read_blocks
from .checks import CHECKS, BlockFailed, Context, broken_links, write_file

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/*.md")
BLOCK_TIMEOUT_S = 120

# The blocks marked `skip`, by document and first line. Changing this set changes what the
# documents leave untested: keep it small, and prefer a snippet that runs.
NOT_RUN = frozenset(
    {
        (
            "README.md",
            "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'"
            " && .venv/bin/emq-bridge demo",
        ),
        ("docs/benchmarks.md", ".venv/bin/pip install -r bench/requirements.txt"),
        ("docs/celery.md", "celery -A proj beat -S emq"),
        ("docs/dramatiq.md", "python -m examples.dramatiq_app"),
    }
)

SERVER = pytest.StashKey[EmbeddedServer]()
SKIPPED = pytest.StashKey[dict[str, list[Block]]]()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.resolve() == Path(__file__).resolve():
        return Documents.from_parent(parent, path=file_path)
    return None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """List the blocks that were not run, with their reasons: never a silent skip."""
    skipped = [block for blocks in config.stash.get(SKIPPED, {}).values() for block in blocks]
    if skipped:
        terminalreporter.section(f"documentation blocks not run: {len(skipped)}")
        for block in skipped:
            terminalreporter.line(f"{block.where}: {block.marker.options['reason']}")


def document_paths() -> list[Path]:
    return [path for pattern in DOCUMENTS for path in sorted(ROOT.glob(pattern))]


# -- the server the blocks run against ----------------------------------------------------


def server_url(config: pytest.Config) -> str:
    """Start the documents' own server on first use.

    Never `$REDIS_URL`'s: snippets use the default prefix `emq` and each chain of blocks
    starts on a flushed server, which only a server of our own allows.
    """
    server = config.stash.get(SERVER, None)
    if server is None:
        server = config.stash[SERVER] = EmbeddedServer().start()
        config.add_cleanup(server.stop)
    return server.url


def flush_server(config: pytest.Config) -> None:
    server = config.stash.get(SERVER, None)
    if server is not None:
        with redis.Redis.from_url(server.url) as client:
            client.flushall()


# -- collection ---------------------------------------------------------------------------


class Documents(pytest.File):
    """README.md and docs/*.md, plus the check of which of their blocks are not run."""

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        self.config.stash[SKIPPED] = {}
        for path in document_paths():
            name = path.relative_to(ROOT).as_posix()
            yield MarkdownDocument.from_parent(self, path=path, name=name)
        yield NotRunBlocks.from_parent(self, name="blocks-not-run")


@dataclass
class Chain:
    """A block and the `continue` blocks after it: one namespace, one server state."""

    start: int
    next: int
    context: Context


class MarkdownDocument(pytest.File):
    """One document: an item per block that runs, and one for its links."""

    blocks: list[Block]
    chain: Chain | None = None

    def collect(self) -> Iterator[pytest.Item]:
        try:
            self.blocks = read_blocks(self.path, ROOT)
        except MarkerError as exc:
            raise self.CollectError(str(exc)) from exc
        self.config.stash[SKIPPED][self.name] = [b for b in self.blocks if b.kind == "skip"]
        self.workdir = Path(tempfile.mkdtemp(prefix="emq-docs-"))
        self.config.add_cleanup(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        for index, block in enumerate(self.blocks):
            if block.kind != "skip":
                yield BlockItem.from_parent(self, name=block.name, index=index)
        yield LinksItem.from_parent(self, name="links")

    def run(self, index: int) -> None:
        """Run block `index`, first replaying the blocks it continues if they did not just run."""
        start = chain_start(self.blocks, index)
        chain = self.chain
        if chain is None or chain.start != start or chain.next != index:
            chain = self.chain = self.new_chain(start)
            for earlier in range(start, index):
                self.run_block(chain, earlier, replaying=True)
        self.run_block(chain, index)

    def new_chain(self, start: int) -> Chain:
        flush_server(self.config)
        first = self.blocks[start]
        module = Path(first.marker.options.get("file", "__main__.py")).stem
        context = Context(ROOT, self.workdir, lambda: server_url(self.config), {"__name__": module})
        return Chain(start, start, context)

    def run_block(self, chain: Chain, index: int, *, replaying: bool = False) -> None:
        block = self.blocks[index]
        self.chain = None  # until the block passes: a failed chain is replayed, not continued
        try:
            for earlier in self.blocks[: index + 1]:
                if "file" in earlier.marker.options:
                    write_file(earlier, chain.context)
            if block.kind != "skip":
                CHECKS[block.kind](block, chain.context)
        except Exception as exc:
            if replaying:
                message = f"{block.where}, which this block continues, failed: {exc}"
                raise BlockFailed(message) from exc
            raise
        chain.next, self.chain = index + 1, chain


def chain_start(blocks: list[Block], index: int) -> int:
    while "continue" in blocks[index].marker:
        index -= 1
    return index


# -- items --------------------------------------------------------------------------------


class BlockItem(pytest.Item):
    def __init__(self, *, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.add_marker(pytest.mark.timeout(BLOCK_TIMEOUT_S))

    @property
    def block(self) -> Block:
        return self.document.blocks[self.index]

    @property
    def document(self) -> MarkdownDocument:
        assert isinstance(self.parent, MarkdownDocument)
        return self.parent

    def runtest(self) -> None:
        self.document.run(self.index)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.block.line - 1, f"{self.block.where} ({self.block.kind})"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, BlockFailed):
            return str(excinfo.value)
        # From the snippet's own frame down (else the check's): pytest's frames say nothing.
        entries = excinfo.traceback
        for start in (self.path, Path(checks.__file__)):
            first = next((i for i, entry in enumerate(entries) if entry.path == start), None)
            if first is not None:
                excinfo.traceback = entries[first:]
                break
        return super().repr_failure(excinfo, style="short")


class LinksItem(pytest.Item):
    """Every relative link of the document leads to a file, and to a heading if it names one."""

    def runtest(self) -> None:
        broken = broken_links(self.path)
        if broken:
            raise BlockFailed("\n".join(broken))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self.path.name}: links"


class NotRunBlocks(pytest.Item):
    """The blocks marked `skip` are exactly the known, short list `NOT_RUN`."""

    def runtest(self) -> None:
        skipped = self.config.stash.get(SKIPPED, {})
        found = {
            (block.document, block.first_line) for blocks in skipped.values() for block in blocks
        }
        if found != NOT_RUN:
            lines = [f"the blocks not run differ from NOT_RUN in {__file__}:"]
            lines += [f"  newly skipped: {d}: {first}" for d, first in sorted(found - NOT_RUN)]
            lines += [f"  no longer skipped: {d}: {first}" for d, first in sorted(NOT_RUN - found)]
            raise BlockFailed("\n".join(lines))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, "documentation blocks not run"
