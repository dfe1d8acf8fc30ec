"""How long a Celery task may wait for a worker: its `expires`, in ms from now; and what its
message says of it, on the server's clock.

A task past its `expires` is not run: a worker that receives it revokes it (reported), but
on RabbitMQ Celery also sets the message's AMQP `expiration`, and the broker drops it unseen
while no worker takes it. A guarded occurrence's message that vanished so would hold its
schedule in flight until the start timeout (10 minutes): the pump bounds it by the expiry
instead (`CeleryDispatcher.expiry_ms`, `Pump._start_timeouts`), counted from the claim.

Celery dates a relative `expires` (seconds) by the clock of the host that sends
(`AMQP.as_task_v2`), and the worker compares that instant with its own; for an absolute one
(an instant) it makes the AMQP `expiration` the time left by that same host's clock
(`Celery.send_task`). A pump whose clock is behind the workers' sent tasks that had expired
on arrival, and one ahead gave RabbitMQ TTLs that dropped tasks early. `server_expiry` makes
both from the claim's time on the server's clock (`Occurrence.released_ms`), the one the
start-timeout bound counts from too.

The `expires` of a task is its template's `options["expires"]` when the options have one,
else the task's own default (`@app.task(expires=...)`), as `Task.apply_async` merges them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

__all__ = ["Expiry", "delay_in_ms", "expires_in_ms", "server_expiry", "task_expires"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Expiry:
    """What a message says of its task's expiry: `header`, the instant in the message's
    `expires` header (ISO 8601, as Celery writes it), and `seconds`, from the claim to that
    instant, the `expires` to give `apply_async` so that the AMQP `expiration` is them."""

    header: str
    seconds: float


def task_expires(options: Any, task_default: Any = None) -> Any:
    """Return the `expires` a task sent with `options` (a template's) has: `options["expires"]`
    when they have that key (None included, as Celery lets it override), else `task_default`
    (the task's `expires` attribute)."""
    if isinstance(options, Mapping) and "expires" in options:
        return options["expires"]
    return task_default


def expires_in_ms(
    template: Mapping[str, Any], now: datetime | None = None, *, task_default: Any = None
) -> int | None:
    """Return the ms from `now` (default: the clock) until the task of `template` expires, as
    Celery reads its `expires` (`task_expires`): seconds after sending, or an ISO 8601
    instant (a naive one in UTC); None without one, or one Celery would not read."""
    expires = task_expires(template.get("options"), task_default)
    if isinstance(expires, bool) or expires is None:
        return None
    if isinstance(expires, int | float):
        return _relative_ms(expires)
    when = _instant(expires)
    if when is None:
        return None
    return round((when - (now or datetime.now(timezone.utc))).total_seconds() * 1000)


def delay_in_ms(template: Mapping[str, Any], now: datetime | None = None) -> int | None:
    """Return how long after its send the task of `template` waits before a worker runs it:
    its options' `countdown` (seconds), or the time left to its `eta` (an ISO 8601 instant, a
    naive one in UTC); None without either. A guarded occurrence is in flight through that
    wait, so the pump lengthens its start timeout by it (`Pump._start_timeouts`)."""
    options = template.get("options")
    if not isinstance(options, Mapping):
        return None
    countdown = options.get("countdown")
    if isinstance(countdown, int | float) and not isinstance(countdown, bool):
        waited = _relative_ms(countdown)
        return waited if waited is not None and waited > 0 else None
    when = _instant(options.get("eta"))
    if when is None:
        return None
    left = round((when - (now or datetime.now(timezone.utc))).total_seconds() * 1000)
    return left if left > 0 else None


def server_expiry(expires: Any, released_ms: int) -> Expiry | None:
    """Return what a message sent for a claim at `released_ms` (on the server's clock) says of
    `expires`: a relative one (seconds) ends those seconds after the claim; an absolute one
    keeps its instant (the header Celery would send) and its seconds count from the claim.
    None without one, or for one Celery refuses itself (past what a date holds, not a date):
    it is then sent as it is, and Celery says why."""
    if isinstance(expires, bool) or expires is None:
        return None
    if isinstance(expires, int | float):
        after_ms = _relative_ms(expires)
        if after_ms is None:
            return None
        try:
            when = _EPOCH + timedelta(milliseconds=released_ms + after_ms)
        except OverflowError:
            return None
        return Expiry(when.isoformat(timespec="microseconds"), expires)
    instant = _instant(expires)
    if instant is None:
        return None
    header = expires if isinstance(expires, str) else instant.isoformat()
    return Expiry(header, (instant - _EPOCH).total_seconds() - released_ms / 1000)


def _instant(expires: Any) -> datetime | None:
    """`expires` as an aware instant (naive is UTC, as Celery's `maybe_make_aware`), or None."""
    if isinstance(expires, datetime):
        when = expires
    elif isinstance(expires, str):
        try:
            when = datetime.fromisoformat(expires)
        except ValueError:
            return None
    else:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _relative_ms(seconds: int | float) -> int | None:
    return round(seconds * 1000) if math.isfinite(seconds) else None
