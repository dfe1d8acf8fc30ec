"""Fixtures of the web view's tests: the app on the test's registry, through Starlette's
TestClient (in-process ASGI, real Redis behind it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from starlette.testclient import TestClient

from emq_bridge import Repeat
from emq_bridge.web import app

TOKEN = "a-write-token-of-some-length"

Client = Callable[..., TestClient]


@pytest.fixture
def web(repeat: Repeat) -> Iterator[Client]:
    """Return a factory of clients of `app(repeat, **options)`; the base URL is the view's."""
    clients: list[TestClient] = []

    def make(**options: Any) -> TestClient:
        client = TestClient(app(repeat, **options), base_url="http://emq.test")
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def keys_state(repeat: Repeat) -> dict[str, Any]:
    """Every key under the test's prefix with its value: what must not change on a refusal."""
    state: dict[str, Any] = {}
    for raw in repeat.client.scan_iter(match=f"{repeat.prefix}:*"):
        key = raw.decode()
        kind = repeat.client.type(key).decode()
        if kind == "zset":
            state[key] = repeat.client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            state[key] = repeat.client.hgetall(key)
        else:
            state[key] = repeat.client.lrange(key, 0, -1) if kind == "list" else kind
    return state


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
