"""A move on a registration that does not exist raises `UnknownRegistration`: an `EmqError`,
as errors.py promises everything emq-bridge raises is, and still a `KeyError`, as these
moves have always said (found by a probe: they raised a bare `KeyError`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from emq_bridge import EmqError, Repeat, UnknownRegistration

MOVES: dict[str, Callable[[Repeat], Any]] = {
    "pause": lambda r: r.pause("q", "ghost"),
    "resume": lambda r: r.resume("q", "ghost"),
    "trigger": lambda r: r.trigger("q", "ghost"),
    "read": lambda r: r.read("q", "ghost"),
    "next_runs": lambda r: r.next_runs("q", "ghost"),
    "backfill": lambda r: r.backfill("q", "ghost", 0, 1000),
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_move_on_an_unknown_registration_raises_an_emq_error_that_is_a_key_error(
    repeat: Repeat, move: str
) -> None:
    with pytest.raises(UnknownRegistration) as raised:
        MOVES[move](repeat)
    assert isinstance(raised.value, EmqError) and isinstance(raised.value, KeyError)
    assert str(raised.value) == "no registration 'ghost' in queue 'q'"
