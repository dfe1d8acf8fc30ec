"""Fixtures of the web view's tests: the app on the test's registry, through Starlette's
TestClient (in-process ASGI, real Redis behind it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_client import Client

from emq_bridge import Repeat
from emq_bridge.web import app


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
