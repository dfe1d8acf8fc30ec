"""`health --json` on a queue whose only schedule will never run again: its earliest next
run is null, not the registry's "no slot" sentinel (9007199254740991) shown as a time."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from click.testing import CliRunner

from emq_bridge import Pump, Repeat
from emq_bridge.cadence import NEVER_MS
from emq_bridge.cli import cli
from emq_bridge.definition import define
from emq_bridge.health import check
from emq_bridge.testing import RecordingDispatcher

UTC = timezone.utc


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_a_queue_whose_schedule_has_no_run_left_shows_no_earliest_run(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    # Registered before its exclusion starts; once its last run fired it has none left.
    definition = define(every="1d", exclude=["2026-01-01..9999-12-31"], template={"task": "t"})
    repeat.upsert(
        "q", "ends", definition=definition, now_ms=ms(datetime(2025, 12, 30, 12, tzinfo=UTC))
    )
    recorder = RecordingDispatcher()
    Pump(repeat, ["q"], recorder).run_once(ms(datetime(2025, 12, 31, 0, 0, 1, tzinfo=UTC)))
    assert [o.due_ms for o in recorder.occurrences] == [ms(datetime(2025, 12, 31, tzinfo=UTC))]
    assert repeat.client.zscore(repeat.keys("q").registry, "ends") == NEVER_MS

    (queue,) = check(repeat, ["q"]).queues
    assert queue.earliest_ms is None and queue.overdue_ms(NEVER_MS) == 0
    result = CliRunner().invoke(
        cli, ["--redis-url", redis_url, "--prefix", prefix, "health", "--queue", "q", "--json"]
    )
    assert result.exit_code == 4  # no live pump: unhealthy, and the JSON says what it found
    assert str(NEVER_MS) not in result.output
    (shown,) = json.loads(result.stdout)["queues"]
    assert shown["earliest_ms"] is None and shown["overdue_ms"] == 0
