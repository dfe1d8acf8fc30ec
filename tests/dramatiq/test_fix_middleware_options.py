"""`RecurringMiddleware` checks its options where it is made, as `emq-bridge pump` checks its
flags: a string for `pump_queues` was three queues ('a', 'b', 'c'), `lease_ms=nan` failed
every claim later as a "registry" error, `schedule_file=5` and `listeners=5` raised
`TypeError`, `report="no"` was taken as on."""

from __future__ import annotations

from typing import Any

import pytest

from emq_bridge import ConfigError
from emq_bridge.dramatiq import RecurringMiddleware


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"pump_queues": "abc"}, r"pump_queues=\.\.\.\) must be a list of queue names"),
        ({"pump_queues": 5}, "must be a list of queue names"),
        ({"lease_ms": float("nan")}, "lease_ms must be a whole number from 1 to 86400000"),
        ({"lease_ms": 0}, "lease_ms must be a whole number"),
        ({"lease_ms": 10**30}, "lease_ms must be a whole number"),
        ({"max_sleep_s": 0}, "max_sleep_s must be a number of seconds above 0"),
        ({"max_sleep_s": float("inf")}, "max_sleep_s must be a number of seconds"),
        ({"max_sleep_s": "x"}, "max_sleep_s must be a number of seconds"),
        ({"schedule_file": 5}, r"schedule_file=\.\.\.\) must be a path"),
        ({"listeners": 5}, r"listeners=\.\.\.\) must be a list of PumpEvents"),
        ({"report": "no"}, r"report=\.\.\.\) must be True or False"),
        ({"run_pump": 1}, r"run_pump=\.\.\.\) must be True or False"),
    ],
)
def test_bad_options_are_a_config_error_at_construction(
    options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        RecurringMiddleware("redis://127.0.0.1:1/0", **options)


def test_good_options_are_kept() -> None:
    middleware = RecurringMiddleware(
        "redis://127.0.0.1:1/0", pump_queues=("a", "b"), lease_ms=5_000, max_sleep_s=0.5
    )
    assert middleware.pump_queues == ("a", "b")
    assert (middleware.lease_ms, middleware.max_sleep_s) == (5_000, 0.5)
