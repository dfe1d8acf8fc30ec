"""A cadence edited between a pump's read of a record and its claim, by an upsert that kept
the score (the new cadence's first run was that very slot), is not claimed with the next run
the pump computed from the old cadence: the pump reads it again and fires the slot on the new
grid.

Before, `claim.lua` checked only the score, so it wrote the old cadence's next run: after
every 1s -> every 3s a slot off the 3 s grid fired; after every 2s -> every 1s a slot of the
new grid was never fired, and not counted missed.
"""

from __future__ import annotations

from typing import Any

import pytest

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TEMPLATE = {"task": "t"}
S = 3_000_000  # a slot of the 1 s, 2 s and 3 s grids


@pytest.mark.parametrize(
    ("old", "new", "next_score"),
    [("1s", "3s", S + 3000), ("2s", "1s", S + 1000)],
)
def test_an_edit_between_read_and_claim_is_read_again(
    repeat: Repeat, old: str, new: str, next_score: int
) -> None:
    repeat.upsert("q", "job", every=old, template=TEMPLATE, now_ms=S - 500)
    assert repeat.get("q", "job").next_run_ms == S  # type: ignore[union-attr]
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    claim = repeat.claim

    def edited_first(*args: Any, **kwargs: Any) -> Any:
        # The editor read its clock just before S; its script lands after the pump's read.
        assert repeat.upsert("q", "job", every=new, template=TEMPLATE, now_ms=S - 20) == "updated"
        assert repeat.get("q", "job").next_run_ms == S  # type: ignore[union-attr]
        repeat.claim = claim  # type: ignore[method-assign]
        return claim(*args, **kwargs)

    repeat.claim = edited_first  # type: ignore[method-assign]
    pump.run_once(S + 5)
    assert sent.clear() == []  # not claimed with the old cadence's next run
    pump.run_once(S + 6)
    (fired,) = sent.clear()
    assert fired.due_ms == S
    registration = repeat.get("q", "job")
    assert registration is not None
    assert registration.next_run_ms == next_score  # on the new grid
    assert registration.missed == 0
