"""Copies held back while their occurrence runs elsewhere.

A copy of a guarded occurrence that the worker's main process revokes on receipt
(`reporting._on_received`) while its occurrence runs now, heartbeated, elsewhere, is held in
the main process (`_hold`) and sent again once that run's heartbeats would have lapsed
(`3 * emq_bridge_heartbeat_s`, plus `RESEND_MARGIN_MS`), if they did: it is the same copy
whether its first run still goes on (the Redis transport) or its pool process was killed
(`task_reject_on_worker_lost` requeues the message at once), and only the heartbeats tell.
A worker that stops sends its held copies back at once (`_release_held`; a killed one loses
them).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.worker import state as worker_state

from ..outcome import Report
from ..reporting import Reporter
from .process_state import _process

log = logging.getLogger("emq_bridge.celery")

# A copy held back while its occurrence runs elsewhere (`_hold`) is sent again this long after
# that run's heartbeats would have lapsed (Dramatiq's middleware waits as long).
RESEND_MARGIN_MS = 1000
# Copies a worker's main process holds back at once, at most (each waits on a timer thread);
# past that a copy is dropped, as every copy was before.
MAX_HELD = 1_000
# How often `_resend` sent a copy again (`lifecycle.MAX_RESENDS` at most): a header of its own.
RESENT_HEADER = "emq_bridge_resent"


def times_resent(message: Any) -> int:
    """How often the copy `message` was sent again by `_resend` (its header; 0 if none, or
    if it is not a count: a negative one would have put the bound off)."""
    headers = getattr(message, "headers", None) or {}
    value = headers.get(RESENT_HEADER, 0) if isinstance(headers, dict) else 0
    return max(value, 0) if isinstance(value, int) and not isinstance(value, bool) else 0


class _Holding:
    """The copies held back in this process (`_hold`), by id and attempt, guarded by the
    process's lock (`process_state._process.lock`), and whether the worker stops."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], _Held] = {}
        self.stopping = False  # the worker stops: a copy is held no more (`_release_held`)

    def after_fork(self) -> None:
        """In a forked child: no held copy (those held are the parent's: their timers did not
        fork)."""
        self.held = {}


_holding = _Holding()
os.register_at_fork(after_in_child=_holding.after_fork)


@dataclass
class _Held:
    """A copy of a guarded task held back by a worker's main process (`_hold`): its message,
    sent again by `_resend` once the run it waits on is heard of no more."""

    app: Celery
    reporter: Reporter
    item: Report  # the copy's `started` report: what `begin` asks about
    message: Any  # the kombu message Celery received
    delay_s: float
    timer: threading.Timer | None = None

    def arm(self) -> None:
        self.timer = threading.Timer(self.delay_s, _resend, ((self.item.id, self.item.attempt),))
        self.timer.daemon = True
        self.timer.start()


def _hold(request: Any, app: Celery, reporter: Reporter, item: Report) -> float | None:
    """Hold back the copy `request` (revoked on receipt: its occurrence runs, heartbeated,
    elsewhere) and send it again once those heartbeats would have lapsed, if they did; return
    that delay in seconds, or None when it is not held (no message to send, too many held, the
    worker stopping). One copy of an attempt is held at a time: a further one is dropped."""
    message = getattr(request, "message", None)
    if message is None or getattr(message, "body", None) is None:
        return None
    delay_s = (reporter.heartbeat_ttl_ms + RESEND_MARGIN_MS) / 1000
    key = (item.id, item.attempt)
    with _process.lock:
        if key in _holding.held:
            return delay_s
        if _holding.stopping or len(_holding.held) >= MAX_HELD:
            return None
        held = _Held(app, reporter, item, message, delay_s)
        _holding.held[key] = held
        held.arm()
    return delay_s


def _resend(key: tuple[str, int]) -> None:
    """A held copy's time: asked again, it waits on (its occurrence still runs, heartbeated),
    is sent again (the run it waited on is heard of no more: the copy's receipt decides as
    usual, and it runs), or is dropped (that run ended, or another occurrence or a later
    attempt of it is in flight)."""
    with _process.lock:
        held = _holding.held.pop(key, None)
    if held is None:
        return  # sent back as the worker stopped
    item = held.item
    try:
        # The copy revoked on receipt still waits for Celery to discard it (for a free pool
        # process): its id is in Celery's revoked set until then, and a message of it
        # received meanwhile would be discarded with it.
        waiting = item.id in _process.revoked_here and item.id in worker_state.revoked
        verdict = "running" if waiting else held.reporter.begin(item, mark=False)
        if verdict == "running":
            with _process.lock:
                if not _holding.stopping:
                    _holding.held[key] = held
                    held.arm()
                    return
        if verdict == "copy":
            why: str | None = "its first copy's run ended"
        elif verdict == "skip":
            why = "another occurrence of its schedule is in flight"
        elif _later_attempt(held):
            why = "a later attempt of it runs or ran"
        else:
            why = None
        if why is not None:
            log.info(
                "emq-bridge: the copy of task %s (%s/%s) held back is dropped: %s",
                item.id,
                item.queue,
                item.name,
                why,
            )
            return
        # Discarded since: its revoke is behind it, so one of the copy sent again (a `replace`,
        # an operator's terminate) is the occurrence's, and reported (`reporting._on_revoked`).
        _process.copies.pop(item.id, None)
        _publish(held, resent=True)
        log.info(
            "emq-bridge: the copy of task %s (%s/%s) held back is sent again: the run it "
            "waited on is heard of no more",
            item.id,
            item.queue,
            item.name,
        )
    except Exception as exc:  # a timer thread: nothing to raise into
        log.warning("emq-bridge: the copy of task %s held back is dropped: %s", item.id, exc)


def _later_attempt(held: _Held) -> bool:
    """Whether the registry has a later attempt of the held copy's occurrence (a retry that
    started: `begin` says "run" for an earlier attempt's copy then)."""
    item = held.item
    repeat = held.reporter.registry()
    for entry in repeat.history(item.queue, item.name):
        if entry.id == item.id:
            return entry.attempt > item.attempt
    return False


def _publish(held: _Held, *, resent: bool = False) -> None:
    """Send the held copy's message again, as it came (headers, body, routing); `resent`
    (the run it waited on is heard of no more) counts it in `RESENT_HEADER`."""
    message = held.message
    headers = dict(message.headers or {})
    if resent:
        headers[RESENT_HEADER] = times_resent(message) + 1
    delivery = dict(getattr(message, "delivery_info", None) or {})
    properties = dict(getattr(message, "properties", None) or {})
    priority = properties.get("priority", delivery.get("priority"))
    with held.app.producer_or_acquire() as producer:
        producer.publish(
            message.body,
            exchange=delivery.get("exchange") or "",
            routing_key=delivery.get("routing_key") or "",
            headers=headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=properties.get("delivery_mode") or 2,
            priority=priority,
            correlation_id=properties.get("correlation_id"),
            reply_to=properties.get("reply_to") or None,
            retry=True,
            retry_policy=held.app.conf.task_publish_retry_policy,
        )


def _release_held() -> None:
    """The worker stops: send each held copy back at once (a worker that takes it decides on
    receipt), rather than lose it with this process. None held: nothing to do."""
    if not _holding.held:
        return
    with _process.lock:
        _holding.stopping = True
        held = list(_holding.held.values())
        _holding.held.clear()
    for copy in held:
        if copy.timer is not None:
            copy.timer.cancel()
        item = copy.item
        try:
            _publish(copy)
            log.info(
                "emq-bridge: the copy of task %s (%s/%s) held back is sent back as the worker "
                "stops",
                item.id,
                item.queue,
                item.name,
            )
        except Exception as exc:
            log.warning("emq-bridge: the copy of task %s held back is dropped: %s", item.id, exc)
