"""A beat stopped while its tick sleeps on the wake-up subscription exits, on every redis-py.

Celery's stop handler closes the scheduler (which closes that subscription) and raises
`SystemExit` where the sleep reads it. On redis-py before 8.2 (every Python 3.10 install, and
5.x anywhere) the read's `finally` then fails on the closed connection (`ValueError: I/O
operation on closed file`), which replaced the `SystemExit`; the sleep took it for a broken
subscription and went on, and Celery's loop kept ticking the closed beat, which kept
sending tasks (a probe: SIGTERM, then Ctrl-C, ignored; only SIGKILL ended it). Now the sleep
re-raises the exit it finds behind such an error, and a closed beat's tick raises it too.
"""

from __future__ import annotations

import pytest
from celery import Celery

from emq_bridge import Pump, Repeat
from emq_bridge.celery import RepeatScheduler
from emq_bridge.registry import WakeSubscription
from emq_bridge.testing import RecordingDispatcher


class OldRedisPy(WakeSubscription):
    """What redis-py < 8.2 raises when a handler's `SystemExit` unwinds through a read of a
    connection the handler closed."""

    def __init__(self) -> None:
        pass

    def wait(self, timeout_s: float) -> bool:
        try:
            raise SystemExit()  # the stop handler, raised in the read
        finally:
            raise ValueError("I/O operation on closed file.")

    def close(self) -> None:
        pass


def test_the_exit_behind_an_error_of_the_closed_subscription_goes_on(repeat: Repeat) -> None:
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    pump._wakeups = OldRedisPy()
    with pytest.raises(SystemExit):
        pump.sleep(5)


def test_a_plain_error_of_the_subscription_still_only_ends_it(repeat: Repeat) -> None:
    class Broken(OldRedisPy):
        def wait(self, timeout_s: float) -> bool:
            raise ValueError("I/O operation on closed file.")

    pump = Pump(repeat, ["q"], RecordingDispatcher())
    pump._wakeups = Broken()
    pump.sleep(0.3)  # no exit: the subscription is dropped, a new one comes at `listen`
    assert pump._wakeups is None


def test_a_closed_beat_sends_nothing_more(redis_url: str, prefix: str) -> None:
    app = Celery("closed_beat", broker="memory://")
    app.conf.update(
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        task_default_queue=f"{prefix}-q",
        beat_schedule={},
        result_backend=None,
        result_expires=None,
    )
    scheduler = RepeatScheduler(app, max_interval=30)
    scheduler.close()
    with pytest.raises(SystemExit):
        scheduler.tick()
