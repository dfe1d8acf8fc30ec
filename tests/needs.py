"""`require`: a test that needs a tool (openssl, a TLS-capable or cluster-capable server)
fails in CI and skips elsewhere when it is missing, so CI can never pass by skipping."""

from __future__ import annotations

import os

import pytest

__all__ = ["IN_CI", "require"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: object, what: str) -> None:
    """Fail in CI, skip elsewhere, when a tool a test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} (CI=true: it must run in CI)")
    pytest.skip(f"{what} (runs in CI)")
