"""Checks of the plain arguments of the API's reads and options (counts, pages), so a bad
one is a `ConfigError` naming it, not a `TypeError` from deep inside or Redis's own
"value is not an integer or out of range" told as a registry failure."""

from __future__ import annotations

from .errors import ConfigError
from .shown import shown

__all__ = ["MAX_INDEX", "whole_arg"]

# Past 2**53 an index is no longer exact in Lua's numbers, and Redis's ranges stop at 2**63.
MAX_INDEX = 2**53


def whole_arg(value: object, what: str, low: int = 0, high: int = MAX_INDEX) -> int:
    """Return `value` when it is an int (not a bool) from `low` to `high`; else `ConfigError`."""
    if type(value) is not int or not low <= value <= high:
        raise ConfigError(f"{what} must be a whole number from {low} to {high}, got {shown(value)}")
    return value
