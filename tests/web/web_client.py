"""What the web view's tests share: the write token, the client factory's type, table rows.

A module of its own, not the conftest: `from conftest import` finds whichever conftest was
imported first when two test directories run in one pytest call.
"""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser

from starlette.testclient import TestClient

TOKEN = "a-write-token-of-some-length"

Client = Callable[..., TestClient]


class _Tables(HTMLParser):
    """Collect the cell texts of each row of the table with a given id."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id, self.depth, self.rows = table_id, 0, []
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and (self.depth or dict(attrs).get("id") == self.table_id):
            self.depth += 1
        elif self.depth and tag == "tr":
            self.row = []
        elif self.depth and tag in ("td", "th") and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self.depth:
            self.depth -= 1
        elif tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.rows.append(self.row)
            self.row = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def table_rows(html: str, table_id: str) -> list[list[str]]:
    """Return the rows (header first) of the table `table_id` in `html`, as cell texts."""
    parser = _Tables(table_id)
    parser.feed(html)
    return parser.rows
