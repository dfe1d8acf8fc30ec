"""`Repeat.from_url(..., clock=...)` gives the registry its clock (session 35's typing probe).

`Repeat(client, prefix, clock=...)` takes a clock, and `from_url` type-checked with one, but
it passed `clock` to redis-py with the client's options: `ConfigError` ("takes no option
'clock'"). It is the registry's own keyword now; every other one still goes to the client.
"""

from __future__ import annotations

import pytest

from emq_bridge import ConfigError, Repeat
from emq_bridge.testing import ManualClock


def test_from_url_takes_the_registrys_clock(redis_url: str, prefix: str) -> None:
    clock = ManualClock(1_900_000_000_000)
    with Repeat.from_url(redis_url, prefix, clock=clock) as repeat:
        assert repeat.clock is clock
        assert repeat.server_time_ms() == 1_900_000_000_000
        clock.advance(1_500)
        assert repeat.server_time_ms() == 1_900_000_001_500


def test_from_url_still_refuses_an_option_the_client_does_not_take(
    redis_url: str, prefix: str
) -> None:
    with pytest.raises(ConfigError, match="takes no option 'clocks'"):
        Repeat.from_url(redis_url, prefix, clocks=ManualClock())
