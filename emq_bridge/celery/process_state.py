"""What a worker process keeps for emq-bridge's Celery receivers (`reporting`, `replacement`,
`held_copies`): its reporters, the copies revoked on receipt, the runs a BaseException ended,
and the key under which a task's request keeps its run's start (`_START`). One object per
process (`_process`), reset in a forked child (`_Process.after_fork`)."""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Celery

from ..outcome import Report
from ..reporting import Reporter

# The `started` report of a task being run, its reporter and the monotonic clock when the
# start was stamped, kept on the task's request (one per execution) so that its end is
# reported without reading the headers again, and timed on a clock no step moves (`_end_ms`).
_START = "_emq_bridge_start"


class _Process:
    """This process's reporters: id(app) -> (app, its Reporter or None when reports are
    off), and the ids of those it reported to (only they hold anything of its own to flush)."""

    def __init__(self) -> None:
        self.reporters: dict[int, tuple[Celery, Reporter | None]] = {}
        self.used: set[int] = set()
        self.lock = threading.Lock()
        # Ids of the copies revoked on receipt since their occurrence ran or runs elsewhere
        # (`_on_received`), each with the request of its run in this worker, if any: their
        # `task_revoked` reports nothing, nor that of a later copy, which Celery revokes by
        # the same id before any receiver hears of it. The oldest go past `MAX_COPIES`.
        self.copies: dict[str, Any] = {}
        # The ids of those copies that only `_on_received` revoked (an operator's revoke
        # was not there first): forgotten by Celery's revoked set once the copy is discarded.
        self.revoked_here: set[str] = set()
        # Task id -> the start of its run here (`_START`), for runs a BaseException ended
        # (`_escaped`): the `task_failure` that may follow carries no request. Oldest first.
        self.escaped: dict[str, tuple[Reporter, Report, float]] = {}
        # The id of a message delivered twice into this worker while Celery discards it
        # (`_discard_alone`): its `task_revoked` is not its occurrence's.
        self.discarding: str | None = None
        # Whether `_on_before_publish` is connected in this process (`_watch_replacements`).
        self.watching = False

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held) and nothing used;
        the reporters are kept (each resets itself on its first report here)."""
        self.lock = threading.Lock()
        self.used = set()


_process = _Process()
os.register_at_fork(after_in_child=_process.after_fork)
