"""`message_option_error`: a schedule's Dramatiq message options Dramatiq's middleware can read.

Part of `emq_bridge.dramatiq`. A template's `options` become the message's options, which
Dramatiq's own middleware reads at run time: `Retries` compares `max_retries` with the
attempt and computes a backoff from `min_backoff`/`max_backoff`, `TimeLimit` and `AgeLimit`
read `time_limit` and `max_age` as milliseconds, `Callbacks` and `Retries` look up
`on_success`, `on_failure` and `on_retry_exhausted` as actor names. A wrong type there fails
in the worker, after the actor ran (a retry that never comes). Options Dramatiq's middleware
does not read are left to the user's middleware.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..shown import shown

__all__ = ["ENQUEUE_ARGUMENTS", "message_option_error", "per_message_keys"]

# Whole numbers: a count, or milliseconds.
_COUNTS = {
    "max_retries": "a count of retries",
    "min_backoff": "milliseconds",
    "max_backoff": "milliseconds",
    "time_limit": "milliseconds",
    "max_age": "milliseconds",
}
_ACTOR_NAMES = ("on_success", "on_failure", "on_retry_exhausted")
# Python objects a message cannot carry: they belong on the actor.
_OBJECTS = ("throws", "retry_when")
# Arguments of `broker.enqueue` (`send_with_options(delay=...)`), not message options: a
# message sent with them in its options is not delayed (the broker reads `eta` only from a
# message it delayed itself), so a schedule holding one would be silently on time.
ENQUEUE_ARGUMENTS = ("delay", "eta")
# Options Dramatiq's broker and middleware, or emq-bridge, write on each message: one a
# schedule stored would be read as theirs (`retries: 3` starts the message on its fourth
# attempt, so Retries gives up early; `emq_guarded` asks the overlap check of a schedule
# that has none) or overwritten.
_PER_MESSAGE = (
    "retries",
    "traceback",
    "requeue_timestamp",
    "redis_message_id",
    "group_completion_uuid",
    "group_completion_callbacks",
)
_OURS = "emq_"


def per_message_keys(options: Mapping[str, Any]) -> list[str]:
    """Return the keys of `options` that Dramatiq's broker and middleware, or emq-bridge,
    write on each message (`retries`, `traceback`, ..., any `emq_*`), in `options`' order.
    A schedule is refused with one (`message_option_error`); the dispatcher drops them from
    a record an earlier release stored with them."""
    return [
        key
        for key in options
        if key in _PER_MESSAGE or (isinstance(key, str) and key.startswith(_OURS))
    ]


def message_option_error(options: Mapping[str, Any]) -> str | None:
    """Return why Dramatiq's middleware cannot use `options`, or None."""
    if not isinstance(options, Mapping):  # a decorator's `options=1.5`
        return f"options must be a dict of message options, got {type(options).__name__}"
    for key, what in _COUNTS.items():
        value = options.get(key)
        if value is not None and (type(value) is not int or value < 0):
            return (
                f"option {key!r} must be a whole number of {what} (0 or more), got {shown(value)}"
            )
    for key in _ACTOR_NAMES:
        value = options.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            return f"option {key!r} must name an actor, got {shown(value)}"
    for key in _OBJECTS:
        if key in options:
            return (
                f"option {key!r} holds Python objects, which a stored schedule cannot carry: "
                "set it on the actor (@dramatiq.actor(...))"
            )
    written = per_message_keys(options)
    if written:
        return (
            f"option {shown(written[0])} is written on each message by Dramatiq or emq-bridge, "
            "not set by a schedule"
        )
    for key in ENQUEUE_ARGUMENTS:
        if key in options:
            return (
                f"option {key!r} is an argument of broker.enqueue, not a message option, so "
                "the message would not be delayed: place the runs later with the cadence "
                "instead (offset= for an interval, the cron expression, at=)"
            )
    return None
