"""Dramatiq message options that are not a mapping at all (`options=1.5`, `options="x"`)
raised `AttributeError` from `message_option_error`; the decorator and `schedule` now raise
one `ScheduleError` line, and `register` refuses them before it writes anything.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
import redis
from cli_runs import key_count
from dramatiq.brokers.stub import StubBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import recurring, register
from emq_bridge.dramatiq.message_options import message_option_error
from emq_bridge.errors import ScheduleError


@pytest.mark.parametrize(("options", "kind"), [(1.5, "float"), ("x", "str"), ([1], "list")])
def test_options_that_are_not_a_mapping_are_named(options: Any, kind: str) -> None:
    assert message_option_error(options) == (
        f"options must be a dict of message options, got {kind}"
    )


@pytest.mark.parametrize("options", [1.5, "x", [("max_retries", 1)]])
def test_the_decorator_raises_a_schedule_error_for_them(options: Any) -> None:
    with pytest.raises(ScheduleError, match=r"^options must be a dict of message options"):
        recurring(every="1m", options=options)


def test_a_huge_option_value_is_quoted_clipped() -> None:
    found = message_option_error({"max_retries": "9" * 100_000})
    assert found is not None and len(found) < 300 and "(100000 characters)" in found


def test_register_refuses_them_and_writes_nothing(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    broker = StubBroker()

    @dramatiq.actor(broker=broker, queue_name="q", actor_name="job")
    def job() -> None:
        pass

    with pytest.raises(ScheduleError, match=r"^options must be a dict of message options"):
        register(Repeat(client, prefix), job, every="1m", options=1.5)  # type: ignore[arg-type]
    assert key_count(client, prefix) == 0
    assert register(Repeat(client, prefix), job, every="1m", options={"max_retries": 1})
    assert key_count(client, prefix) > 0  # what the refusal would have written
