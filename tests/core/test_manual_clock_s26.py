"""`ManualClock.advance` moves forward only (found by a probe, session 26: a negative step
moved the test's clock back without a word)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from emq_bridge.testing import ManualClock


@pytest.mark.parametrize("back", [-1, timedelta(hours=-1)])
def test_advance_refuses_a_step_back_and_leaves_the_clock(back: int | timedelta) -> None:
    clock = ManualClock(1_900_000_000_000)
    with pytest.raises(ValueError, match="step back"):
        clock.advance(back)
    assert clock() == 1_900_000_000_000
    assert clock.set(1_800_000_000_000) == 1_800_000_000_000  # set goes anywhere
    assert clock.advance(0) == clock.advance(timedelta(0)) == 1_800_000_000_000
