"""Records a release before session 27 accepted, which its checks now refuse as input (a cron
holding a line break or another Unicode blank, a host zone file such as `localtime`), keep
firing after the upgrade: read back from the registry they are what they were, while a new
definition with them is refused (tests/core/test_bad_values_s27.py). Before the fix, the
upgraded pump parked them as corrupt and never sent them again, and `show` refused them
(session 27's rolling-deploy probe)."""

from __future__ import annotations

import pytest
import redis

from emq_bridge import Pump, Repeat, ScheduleError, define
from emq_bridge.testing import RecordingDispatcher


@pytest.mark.parametrize(
    ("cron", "tz"), [("* * * * *\r", "UTC"), ("* * * * *", "localtime"), ("*\t* * * *", "UTC")]
)
def test_a_stored_cron_of_an_earlier_release_keeps_firing(
    repeat: Repeat, client: redis.Redis, cron: str, tz: str
) -> None:
    minute_ago = repeat.server_time_ms() - 61_000
    repeat.register("q", "old", cron="* * * * *", template={"task": "t"}, now_ms=minute_ago)
    # What the earlier release wrote for such a definition.
    client.hset(repeat.keys("q").record("old"), mapping={"cron": cron, "tz": tz})
    registration = repeat.get("q", "old")  # not corrupt
    assert registration is not None and registration.definition.cadence.to_fields()["tz"] == tz
    recorder = RecordingDispatcher()
    tick = Pump(repeat, ["q"], recorder).run_once()
    assert tick.parked == [] and recorder.names() == ["old"]
    if cron != "*\t* * * *":  # a tab separates fields as in crontab(5): still taken as input
        with pytest.raises(ScheduleError):
            define(cron=cron, tz=tz, template={"task": "t"})
