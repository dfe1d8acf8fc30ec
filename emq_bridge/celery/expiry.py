"""How long a Celery task may wait for a worker: its `expires` option, in ms from now; and
the instant a relative `expires` ends, on the server's clock.

A task past its `expires` is not run: a worker that receives it revokes it (reported), but
on RabbitMQ Celery also sets the message's AMQP `expiration`, and the broker drops it unseen
while no worker takes it. A guarded occurrence's message that vanished so would hold its
schedule in flight until the start timeout (10 minutes): the pump bounds it by the expiry
instead (`CeleryDispatcher.expiry_ms`, `Pump._start_timeouts`), counted from the claim.

Celery turns relative `expires` seconds into an instant by the clock of the host that sends
(`AMQP.as_task_v2`), and the worker compares it with its own: a pump whose clock is behind
the workers' sent tasks that had expired on arrival. `expires_at` makes that instant from
the claim's time on the server's clock (`Occurrence.released_ms`), the one the start-timeout
bound counts from too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

__all__ = ["expires_at", "expires_in_ms"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def expires_in_ms(template: Mapping[str, Any], now: datetime | None = None) -> int | None:
    """Return the ms from `now` (default: the clock) until the task of `template` expires, as
    Celery reads its `options["expires"]`: seconds after sending, or an ISO 8601 instant (a
    naive one in UTC); None without one, or one Celery would not read."""
    options = template.get("options")
    expires = options.get("expires") if isinstance(options, Mapping) else None
    if isinstance(expires, bool) or expires is None:
        return None
    if isinstance(expires, int | float):
        return _relative_ms(expires)
    if not isinstance(expires, str):
        return None
    try:
        when = datetime.fromisoformat(expires)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round((when - (now or datetime.now(timezone.utc))).total_seconds() * 1000)


def expires_at(options: Mapping[str, Any], released_ms: int) -> str | None:
    """Return when a task sent with `options` expires, as the ISO 8601 UTC text Celery writes
    in a message's `expires`, for a relative `expires` (seconds): `released_ms` (the claim,
    on the server's clock) plus those seconds. None without one, for an absolute one (Celery
    sends that as it is given) or one past what a date can hold (Celery says why)."""
    expires = options.get("expires")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        return None
    after_ms = _relative_ms(expires)
    if after_ms is None:
        return None
    try:
        when = _EPOCH + timedelta(milliseconds=released_ms + after_ms)
    except OverflowError:
        return None
    return when.isoformat(timespec="microseconds")


def _relative_ms(seconds: int | float) -> int | None:
    return round(seconds * 1000) if math.isfinite(seconds) else None
