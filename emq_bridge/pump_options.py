"""The bounds of a pump's options, checked once for every way a pump is made (`Pump`, the
Dramatiq middleware, `emq-bridge pump`), so a bad one is a `ConfigError` where it is given,
not a failed claim at every tick."""

from __future__ import annotations

import math

from .arguments import whole_arg
from .errors import ConfigError
from .shown import shown

__all__ = ["MAX_BATCH_SIZE", "MAX_LEASE_MS", "MAX_SLEEP_S", "check_pump_options"]

# A claim of more than this holds the server too long in one script.
MAX_BATCH_SIZE = 100_000
# A lease longer than a day would keep a crashed pump's occurrences from being re-sent that long.
MAX_LEASE_MS = 86_400_000
# An hour: finite, so the heartbeat's TTL is too.
MAX_SLEEP_S = 3600.0


def check_pump_options(
    *, batch_size: object = 1, lease_ms: object = 1, max_sleep_s: object = 1.0, owner: str = ""
) -> None:
    """Raise `ConfigError` for a batch size, lease or longest sleep out of its bounds; `owner`
    prefixes the message with where it was given (e.g. "RecurringMiddleware(...): ")."""
    whole_arg(batch_size, f"{owner}batch_size", 1, MAX_BATCH_SIZE)
    whole_arg(lease_ms, f"{owner}lease_ms", 1, MAX_LEASE_MS)
    if (
        isinstance(max_sleep_s, bool)
        or not isinstance(max_sleep_s, (int, float))
        or not math.isfinite(max_sleep_s)
        or not 0 < max_sleep_s <= MAX_SLEEP_S
    ):
        raise ConfigError(
            f"{owner}max_sleep_s must be a number of seconds above 0 and at most "
            f"{MAX_SLEEP_S:g}, got {shown(max_sleep_s)}"
        )
