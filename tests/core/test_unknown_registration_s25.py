"""Errors a probe found wrong: a move on a registration that does not exist raises
`UnknownRegistration`, an `EmqError`, as errors.py promises everything emq-bridge raises is,
and still a `KeyError`, as these moves have always said (they raised a bare `KeyError`); a
failed upsert names its queue once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from emq_bridge import EmqError, RegistryError, Repeat, UnknownRegistration, define
from emq_bridge.registry import UPSERT_CHUNK

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


def test_a_failed_upsert_of_many_chunks_names_its_queue_once(
    repeat: Repeat, client: redis.Redis, prefix: str
) -> None:
    # It said `upsert q, q, q, ...`, once per chunk of the same queue (found by a probe).
    client.set(f"{prefix}:{{q}}:repeat", "not a sorted set")
    definition = define(every="1h", template={"task": "t"})
    items = [("q", f"job-{i}", definition) for i in range(2 * UPSERT_CHUNK + 1)]
    with pytest.raises(RegistryError) as raised:
        repeat.upsert_many(items)
    assert str(raised.value).startswith("upsert q: "), str(raised.value)[:200]
