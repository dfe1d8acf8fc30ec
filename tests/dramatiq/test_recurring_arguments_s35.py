"""A Dramatiq schedule whose args and kwargs the actor refuses is refused where it is
declared (found by a probe of the typed public API, session 35).

Before: `@recurring(every="1h")` on `def needs(n)` imported and synced, and every slot
failed in the worker with a `TypeError` (`missing 1 required positional argument`), for
ever (nothing parks a schedule whose task fails). Dramatiq sends any arguments; the actor's
signature is read where the schedule is declared: the decorator, the `recurring=` option
(read at the middleware's boot) and the runtime `register`, which writes nothing then.
"""

from __future__ import annotations

import dramatiq
import pytest
import redis
from cli_runs import key_count
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import recurring, register
from emq_bridge.dramatiq.schedule import actor_declarations
from emq_bridge.errors import ScheduleError

REFUSED = r"its args and kwargs do not fit the actor: missing a required argument: 'n'"


def test_the_decorator_refuses_arguments_the_actor_does_not_take() -> None:
    broker = StubBroker()
    with pytest.raises(ScheduleError, match=rf"schedule 'needs' of actor 'needs': {REFUSED}"):

        @recurring(every="1h")
        @dramatiq.actor(broker=broker, actor_name="needs")
        def needs(n: int) -> None:
            pass

    @recurring(every="1h", args=[1])
    @recurring(every="1h", kwargs={"n": 2}, name="by-name")
    @dramatiq.actor(broker=broker, actor_name="fits")
    def fits(n: int) -> None:
        pass

    @recurring(every="1h", args=[1, 2], kwargs={"x": 3})
    @dramatiq.actor(broker=broker, actor_name="anything")
    def anything(*args: int, **kwargs: int) -> None:
        pass

    assert [d.name for d in actor_declarations(fits)] == ["by-name", "fits"]


def test_the_recurring_option_is_checked_as_the_middleware_reads_it() -> None:
    broker = StubBroker()
    broker.actor_options.add("recurring")

    @dramatiq.actor(broker=broker, actor_name="opt", recurring={"every": "1h", "args": [1, 2]})
    def opt(n: int) -> None:
        pass

    with pytest.raises(ScheduleError, match=r"takes? .*positional argument|too many positional"):
        actor_declarations(opt)


def test_register_refuses_them_and_writes_nothing(client: redis.Redis, prefix: str) -> None:
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job(n: int) -> None:
        pass

    with pytest.raises(ScheduleError, match=REFUSED):
        register(Repeat(client, prefix), job, every="1m")
    assert key_count(client, prefix) == 0
    assert register(Repeat(client, prefix), job, every="1m", args=[1])
