"""How long a Celery task may wait for a worker: its `expires` option, in ms from now.

A task past its `expires` is not run: a worker that receives it revokes it (reported), but
on RabbitMQ Celery also sets the message's AMQP `expiration`, and the broker drops it unseen
while no worker takes it. A guarded occurrence's message that vanished so would hold its
schedule in flight until the start timeout (10 minutes): the pump bounds it by the expiry
instead (`CeleryDispatcher.expiry_ms`, `Pump._start_timeouts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = ["expires_in_ms"]


def expires_in_ms(template: Mapping[str, Any], now: datetime | None = None) -> int | None:
    """Return the ms from `now` (default: the clock) until the task of `template` expires, as
    Celery reads its `options["expires"]`: seconds after sending, or an ISO 8601 instant (a
    naive one in UTC); None without one, or one Celery would not read."""
    options = template.get("options")
    expires = options.get("expires") if isinstance(options, Mapping) else None
    if isinstance(expires, bool) or expires is None:
        return None
    if isinstance(expires, int | float):
        return round(expires * 1000) if math.isfinite(expires) else None
    if not isinstance(expires, str):
        return None
    try:
        when = datetime.fromisoformat(expires)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round((when - (now or datetime.now(timezone.utc))).total_seconds() * 1000)
