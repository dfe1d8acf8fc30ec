"""What docs/cron.md says of an exclusion rule and a slot a DST gap moves: the rule is
matched at the wall time the slot fires at (found by a probe: a rule on a daily 01:30 in
Europe/London did not leave out the 02:00 BST run of the spring-forward day)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from emq_bridge import define

LONDON = ZoneInfo("Europe/London")


def _sundays_run(exclude: list[str]) -> list[str]:
    """The runs of March 2030 that fall on a Sunday (the 31st is the spring-forward day)."""
    definition = define(cron="30 1 * * *", tz="Europe/London", exclude=exclude, template={})
    after = int(datetime(2030, 3, 1, tzinfo=LONDON).timestamp() * 1000)
    out = []
    while True:
        after = definition.cadence.next_after(after)
        run = datetime.fromtimestamp(after / 1000, LONDON)
        if run.month != 3:
            return out
        if run.weekday() == 6:
            out.append(run.isoformat())


def test_a_rule_is_matched_at_the_moved_time_of_a_slot_a_gap_moves() -> None:
    assert _sundays_run([]) == [
        "2030-03-03T01:30:00+00:00",
        "2030-03-10T01:30:00+00:00",
        "2030-03-17T01:30:00+00:00",
        "2030-03-24T01:30:00+00:00",
        "2030-03-31T02:00:00+01:00",  # 01:30 does not exist that day: moved to 02:00 BST
    ]
    assert _sundays_run(["cron:30 1 * * 0"]) == ["2030-03-31T02:00:00+01:00"]
    assert _sundays_run(["cron:30 1 * * 0", "cron:0 2 * * 0"]) == []
