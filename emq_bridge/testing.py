"""Helpers for users' own test suites.

* `RecordingDispatcher` keeps every occurrence the pump hands it.
* `ManualClock` is an injectable clock a test advances to see exactly what fires.
* `fake_repeat()` gives a `Repeat` on fakeredis (with its Lua support, `fakeredis[lua]`)
  for suites that run without a server. The registry tests run on it as well as on a real
  server, so it behaves the same for every move emq-bridge makes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import redis

from .dispatch import Dispatcher
from .millis import floor_ms, instant_ms
from .occurrence import Occurrence
from .pump import Pump
from .registry import Repeat

__all__ = ["ManualClock", "RecordingDispatcher", "fake_repeat", "manual_pump"]

_FAKEREDIS = "pip install 'fakeredis[lua]'"


class RecordingDispatcher:
    """A dispatcher that records occurrences instead of sending them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.occurrences: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        with self._lock:
            self.occurrences.append(occurrence)

    def names(self) -> list[str]:
        with self._lock:
            return [o.name for o in self.occurrences]

    def clear(self) -> list[Occurrence]:
        with self._lock:
            taken, self.occurrences = self.occurrences, []
        return taken


class ManualClock:
    """A clock in epoch ms that moves only when the test says so.

    It starts at, and `set` moves it to, epoch ms or an aware `datetime`: a naive one raises
    `ScheduleError` (it names no instant; the host's zone would decide which). Its ms are
    whole: a float with a fraction (`1.5`) raises `ValueError` (`2.0` is taken).
    """

    def __init__(self, start: int | datetime = datetime(2030, 1, 1, tzinfo=timezone.utc)) -> None:
        self.now_ms = _instant(start, "ManualClock starts at")

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, by: int | timedelta) -> int:
        """Move forward by ms or a `timedelta`; return the new now. `ValueError` for a step
        back (`set` moves it anywhere)."""
        if isinstance(by, timedelta):
            step = floor_ms(by)
        else:
            step = _whole(by, "advance moves by whole ms", "a timedelta")
        if step < 0:
            raise ValueError(f"advance moves forward: {by!r} is a step back (use set)")
        self.now_ms += step
        return self.now_ms

    def set(self, at: int | datetime) -> int:
        self.now_ms = _instant(at, "set moves to")
        return self.now_ms


def _instant(at: int | datetime, what: str) -> int:
    if isinstance(at, datetime):
        return instant_ms(at)
    return _whole(at, f"{what} whole epoch ms", "an aware datetime")


def _whole(value: int | float, what: str, other: str) -> int:
    """`value` as an int of ms; `ValueError` for a float that is not a whole number (its
    fraction would be dropped without a word)."""
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{what}: {value!r} is not a whole number (give an int or {other})")
    return int(value)


def fake_repeat(
    prefix: str = "emq", *, clock: Callable[[], int] | None = None, **options: Any
) -> Repeat:
    """Return a `Repeat` on a fresh in-memory fakeredis server (needs `fakeredis[lua]`);
    `clock` (a `ManualClock`) is its clock (`Repeat.clock`): what is synced or registered on
    it is placed at the test's time, and a `Pump` on it given no clock runs on it too.

    Raises `ImportError` saying `pip install 'fakeredis[lua]'` when fakeredis is missing, or
    is there without its Lua support (the `lupa` package: every registry move is a script).
    """
    try:
        import fakeredis
    except ImportError as exc:
        raise ImportError(
            f"fake_repeat needs fakeredis with its Lua support: {_FAKEREDIS}"
        ) from exc
    client = fakeredis.FakeRedis(**options)
    try:
        client.eval("return 1", 0)  # fakeredis answers an unknown command without lupa
    except redis.exceptions.ResponseError as exc:
        raise ImportError(
            f"fake_repeat needs fakeredis' Lua support (the lupa package), which it lacks "
            f"({exc}): {_FAKEREDIS}"
        ) from exc
    return Repeat(client, prefix, clock=clock)


def manual_pump(
    repeat: Repeat, queues: list[str], clock: ManualClock, dispatcher: Dispatcher | None = None
) -> Pump:
    """Return a pump driven by `clock`, recording into a `RecordingDispatcher` by default.

    `clock` becomes the registry's clock too, unless it has one (`Repeat.clock`): the syncs
    made at a worker's or beat's boot on that registry then place their schedules on it, so
    the pump fires exactly what is due at the clock's time. A `dispatcher` without a
    `dispatch` method raises `TypeError`."""
    if dispatcher is not None and not callable(getattr(dispatcher, "dispatch", None)):
        raise TypeError(
            "manual_pump(dispatcher=...) needs a dispatcher, an object with a dispatch("
            f"occurrence) method (a RecordingDispatcher()), got {type(dispatcher).__name__}"
        )
    if repeat.clock is None:
        repeat.clock = clock
    return Pump(repeat, queues, dispatcher or RecordingDispatcher(), clock=clock)
