"""A pump behind a backlog ends its tick after `TICK_BUDGET_S` even while batches come back
full, so its heartbeat is written (and `on_tick` told, and what the tick sent let go) while it
is still sending; the next tick starts at once and every slot still goes out once. Before
(session 27's soak probe), a pump that could not keep up stayed in one tick: its heartbeat
lapsed while it sent (`pumps` and `health` said it was dead) and its memory grew with every
occurrence the tick held."""

from __future__ import annotations

import threading
import time

import pytest

import emq_bridge.pump
from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.events import PumpEvents, Tick
from emq_bridge.testing import RecordingDispatcher

DUE = 1_500


class SlowDispatcher(RecordingDispatcher):
    """A broker that takes a millisecond a message: 1,500 due take a second and a half."""

    def dispatch(self, occurrence: Occurrence) -> None:
        time.sleep(0.001)
        super().dispatch(occurrence)


class TickSizes(PumpEvents):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def on_tick(self, tick: Tick) -> None:
        self.sizes.append(len(tick.dispatched))


def test_a_pump_behind_ends_its_ticks_and_heartbeats_while_it_sends(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emq_bridge.pump, "TICK_BUDGET_S", 0.2)
    hour_ago = repeat.server_time_ms() - 3_600_000
    template = {"task": "t"}
    for i in range(DUE):
        repeat.register("q", f"s{i:04d}", every="1h", template=template, now_ms=hour_ago)
    dispatcher = SlowDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)
    ticks: list[int] = []
    pump.events.add(TickSizes(ticks))
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not repeat.pumps(["q"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        heartbeat_seen_at = len(dispatcher.occurrences)
        while len(dispatcher.occurrences) < DUE and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(30)
    assert heartbeat_seen_at < DUE, "the heartbeat came only once the backlog was sent"
    assert len(ticks) >= 3 and max(ticks) < DUE  # several ticks, none holding all of it
    dues = [(o.name, o.due_ms) for o in dispatcher.occurrences]
    assert len(dues) == DUE and len(set(dues)) == DUE  # every slot once


def test_run_once_still_fires_everything_due(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `run_once` (`emq-bridge pump --once`, tests, a manual pump) is "everything due now",
    # however long it takes: the budget is the loop's.
    monkeypatch.setattr(emq_bridge.pump, "TICK_BUDGET_S", 0.05)
    hour_ago = repeat.server_time_ms() - 3_600_000
    for i in range(300):
        repeat.register("q", f"s{i:03d}", every="1h", template={"task": "t"}, now_ms=hour_ago)
    dispatcher = SlowDispatcher()
    tick = Pump(repeat, ["q"], dispatcher, batch_size=50).run_once()
    assert len(tick.dispatched) == 300 == len(dispatcher.occurrences)
