"""`Repeat.scan` and `scan_many` called by a test on a registry with a clock (`Repeat.clock`,
`fake_repeat(clock=)`) read the server's `TIME`, where every other move read the test's clock:
a schedule placed at the test's 2030 was never due to them (session 33). They read the
registry's clock now, as the pump does; on the test server and on fakeredis (`any_repeat`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from emq_bridge import Repeat
from emq_bridge.testing import ManualClock


def test_a_scan_given_no_now_reads_the_registrys_clock(any_repeat: Repeat) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=timezone.utc))
    any_repeat.clock = clock
    any_repeat.register("reports", "refresh", every="1h", template={"task": "t"})

    assert any_repeat.scan("reports", 10).due == []
    clock.advance(timedelta(hours=1))
    assert [name for name, _ in any_repeat.scan("reports", 10).due] == ["refresh"]
    [many] = any_repeat.scan_many(["reports"], 10)
    assert not isinstance(many, Exception)
    assert [name for name, _ in many.due] == ["refresh"]
    # A `now_ms` given still decides.
    assert any_repeat.scan("reports", 10, now_ms=clock() - 1).due == []
