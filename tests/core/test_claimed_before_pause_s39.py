"""A pump claims a batch of due occurrences, then sends them one by one: one a `pause` or a
`remove` found claimed (its slot due before the command) is still sent by that batch, after
the command returned (schedules-and-cli.md, `pause` and `remove`). Found by session 39's probe
of live edits (a broker slow to take a batch: up to about a second after the command).
Nothing later than the claimed slot is sent."""

from __future__ import annotations

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.testing import RecordingDispatcher


class PausingDispatcher(RecordingDispatcher):
    """Records each send; at the first, pauses one schedule and removes another, as an
    operator's commands landing while the batch goes out."""

    def __init__(self, repeat: Repeat) -> None:
        super().__init__()
        self.repeat = repeat

    def dispatch(self, occurrence: Occurrence) -> None:
        if not self.occurrences:
            assert self.repeat.pause("q", "paused")
            assert self.repeat.cancel("q", "removed")
        super().dispatch(occurrence)


def test_an_occurrence_claimed_before_a_pause_or_remove_goes_out_with_its_batch(
    repeat: Repeat,
) -> None:
    for name in ("first", "paused", "removed"):
        repeat.register("q", name, every="1h", template={"task": name}, immediately=True)
    sent = PausingDispatcher(repeat)
    pump = Pump(repeat, ["q"], sent)
    tick = pump.run_once()
    assert sorted(sent.names()) == ["first", "paused", "removed"]
    assert len(tick.dispatched) == 3
    # Nothing after: the paused one waits for its resume, the removed one is gone.
    now = repeat.server_time_ms()
    pump.run_once(now + 2 * 3_600_000)
    assert sorted(sent.names()) == ["first", "first", "paused", "removed"]
    paused = repeat.get("q", "paused")
    assert paused is not None and paused.paused
    assert repeat.get("q", "removed") is None  # cancel: what `remove` calls
