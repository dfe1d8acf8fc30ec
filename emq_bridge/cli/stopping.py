"""How `emq-bridge pump` stops on SIGTERM or SIGINT, also when a send hangs.

The first signal asks the pump to settle the batch in hand (`Pump.stop`: sent within
`STOP_GRACE_S`, or handed back). A send blocked on a broker that hangs (a stopped process, a
network that drops without a reset, a broker holding its publishers) never sees that, and
the pod would stay up until Kubernetes kills it, its claimed batch left to wait out the
lease. So the signal also sets an alarm: if the pump has not stopped `STOP_DEADLINE_S` later,
`StopOverdue` is raised in the main thread, inside the blocked call, and the pump's
interruption path acks what was sent and hands back the rest, the occurrence whose send hung
included (it may have reached the broker: the next pump sends it again, same id, marked
redelivered). The alarm is set again each time, so a hand-back that hangs too is cut short.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from ..pump import STOP_DEADLINE_S

__all__ = ["STOP_DEADLINE_S", "StopOverdue", "stop_on_signals"]

log = logging.getLogger("emq_bridge.cli.operations")


class StopOverdue(BaseException):
    """The pump did not stop `STOP_DEADLINE_S` after a stop signal (a send that hangs).

    A `BaseException`, as `KeyboardInterrupt` is: no `except Exception` of a send or an
    adapter swallows it, and the pump's interruption path settles the batch in hand."""


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set `stop` on SIGTERM or SIGINT (a second SIGINT interrupts at once); raise
    `StopOverdue` if what runs inside has not returned `STOP_DEADLINE_S` after the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        # The pump settles the batch in hand: sent within `STOP_GRACE_S`, or handed back.
        log.info(
            "%s received: settling the batch in hand, then stopping", signal.Signals(signum).name
        )
        if not stop.is_set():
            signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_S)
        stop.set()

    def overdue(signum: int, frame: FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_S)  # should the hand-back hang too
        raise StopOverdue

    previous = {
        sig: signal.signal(sig, handler if sig != signal.SIGALRM else overdue)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
    }
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, old in previous.items():
            signal.signal(sig, old or signal.SIG_DFL)  # None: a handler not set from Python
