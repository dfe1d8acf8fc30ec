"""A queue given as one string, where a list of queues is asked for, is refused as `Pump`
refuses it, not read letter by letter (found by a probe of client variants, session 36:
`repeat.pumps("rq")` answered 0 pumps, `health.check(repeat, "rq")` said no live pump serves
queue 'r', a registrations collector exported `queue="r"`). A real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from emq_bridge import Repeat
from emq_bridge.health import check
from emq_bridge.metrics.registrations import RegistrationsCollector

CALLS: dict[str, Callable[[Repeat], Any]] = {
    "pumps": lambda repeat: repeat.pumps("rq"),
    "pumps_by_queue": lambda repeat: repeat.pumps_by_queue("rq"),
    "health.check": lambda repeat: check(repeat, "rq"),
    "RegistrationsCollector": lambda repeat: RegistrationsCollector(repeat, "rq"),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_one_string_for_a_list_of_queues_is_refused(repeat: Repeat, call: str) -> None:
    with pytest.raises(
        TypeError, match=r"queues must be a list of queue names, not a string: \['rq'\]"
    ):
        CALLS[call](repeat)


def test_a_list_of_one_queue_is_taken(repeat: Repeat) -> None:
    assert repeat.pumps(["rq"]) == []
    assert repeat.pumps_by_queue(["rq"]) == {"rq": []}
