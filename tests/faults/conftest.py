"""Fixtures for the fault scenarios: servers each test may kill, restart or reconfigure.

Every fault test gets servers of its own (never the shared `redis_url` one): it kills them,
restarts them or changes their configuration. A tool a scenario needs (the server binary,
`openssl`, a TLS-capable `redis-server`) fails the test in CI when missing and skips it
elsewhere, so CI can never pass by skipping.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from needs import require  # the fault tests import it from here too

from emq_bridge.embedded import EmbeddedServer

from .cluster import Cluster


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """In a forked child: get SIGKILL when the test process dies, so nothing is left behind."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Print a scenario's figures to the terminal, even under output capture."""

    def show(line: str) -> None:
        with capsys.disabled():
            print(f"\n[figures] {line.strip()}")

    return show


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A fresh embedded server that only this test uses."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def own_client(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(own_server.url)
    yield connection
    connection.close()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def redis_cli() -> str:
    found = shutil.which("redis-cli") or shutil.which("valkey-cli")
    require(found, "redis-cli is not on PATH")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A three-master Redis Cluster of embedded servers (`cluster.py`), one per test module
    that asks for it (its tests kill masters, move slots: no other module shares it)."""
    built = Cluster().start()
    try:
        yield built
    finally:
        built.stop()
