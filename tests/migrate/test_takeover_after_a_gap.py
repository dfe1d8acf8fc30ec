"""What docs/migration.md says of a switch from celery-redbeat with a gap between the beats.

An entry only the import holds fires at once when it is overdue, as redbeat would on its
restart; an interval of the app's `beat_schedule` that the beat takes over moves onto
emq-bridge's grid instead, and the slots that passed meanwhile are dropped, counted missed
(a change of cadence while overdue), its next run the next grid slot. The two statements
were at odds in the page; this pins both on real beats' keys and a real `RepeatScheduler`.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import redis
from beats import beat_app
from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry

from emq_bridge import Repeat
from emq_bridge.celery import RepeatScheduler
from emq_bridge.testing import ManualClock

INTERVAL_S = 60
GAP_S = 5 * INTERVAL_S  # both beats stopped for five intervals


def test_after_a_gap_an_imported_entry_fires_at_once_and_a_taken_over_one_waits_for_its_grid(
    run: Run, client: redis.Redis, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery
) -> None:
    queue = f"{prefix}-q"
    # The taken-over entry's next run is the next whole minute: start well before one, so
    # the ticks below, a second apart, cannot reach it (a start in a minute's last second
    # made it due at the second tick, and sent).
    into_minute_ms = repeat.server_time_ms() % (INTERVAL_S * 1000)
    if into_minute_ms > 45_000:
        time.sleep((INTERVAL_S * 1000 - into_minute_ms) / 1000 + 0.2)
    now_ms = repeat.server_time_ms()
    last_run = datetime.fromtimestamp(now_ms / 1000 - GAP_S, UTC)
    every = schedule(timedelta(seconds=INTERVAL_S))
    for name in ("declared", "imported-only"):
        entry = RedBeatSchedulerEntry(name, "app.t", every, app=redbeat_app).save()
        entry.reschedule(last_run_at=last_run)  # redbeat's last run: five intervals ago
    imported = run(
        "import",
        "redbeat",
        "--from",
        redis_url,
        "--prefix",
        redbeat_app.redbeat_conf.key_prefix,
        "--queue",
        queue,
    )
    assert imported.exit_code == 0, imported.output

    app = beat_app(
        f"beatg-{prefix}",
        redis_url,
        prefix,
        queue,
        {"declared": {"task": "app.t", "schedule": timedelta(seconds=INTERVAL_S)}},
    )
    scheduler = RepeatScheduler(app)  # syncs: takes "declared" over
    try:
        assert scheduler.pump is not None
        clock = ManualClock(scheduler.pump.repeat.server_time_ms())
        scheduler.pump.clock = clock
        scheduler.tick()
        clock.advance(1000)
        scheduler.tick()
    finally:
        scheduler.close()
        app.close()

    sent = [json.loads(raw)["headers"]["emq_schedule"] for raw in client.lrange(queue, 0, -1)]
    assert sent == [f"{queue}/imported-only"]  # overdue: fired at once, and once
    declared = repeat.get(queue, "declared")
    assert declared is not None and declared.source == f"celery.beatg-{prefix}"
    assert declared.missed >= 1  # the passed slots, dropped: counted, not sent
    assert declared.next_run_ms is not None
    assert now_ms < declared.next_run_ms <= now_ms + 2 * INTERVAL_S * 1000
    assert declared.next_run_ms % (INTERVAL_S * 1000) == 0  # on the grid
