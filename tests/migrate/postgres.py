"""The loopback PostgreSQL the django-celery-beat tests create their databases on.

A module of its own, not the conftest (see `cli_run.py`)."""

from __future__ import annotations

import os
import socket

import pytest

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_postgres() -> None:
    """Skip the test when PostgreSQL is not reachable on loopback; fail it in CI, where it
    must be."""
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return
    except OSError:
        pass
    if IN_CI:
        pytest.fail("PostgreSQL is not reachable at 127.0.0.1:5432 and CI=true")
    pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432 (runs in CI)")
