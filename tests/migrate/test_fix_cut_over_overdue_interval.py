"""A staged cut-over (`import --paused`, then `--resume`) of a redbeat interval that fell due
while redbeat was already stopped resumes at the next slot of its rhythm, and a direct import
fires the overdue interval at once, then an interval after that, as Celery's beat runs an
overdue entry.

Before, the overdue slot was carried as `now`, which dropped the interval's phase: the resume
then stepped a whole interval from that instant, so the slot redbeat would have sent next was
never sent (a 58 s gap on a 20 s interval, `missed 0`). Then (session 27) the direct import
fired the overdue slot of that rhythm, whose next slot came less than an interval after the
fire (a 60 s interval fired again 35.8 s later).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

MINUTE_MS = 60_000


def stopped_90_s_ago(app: Celery) -> int:
    """A one-minute interval that last ran 90 s ago: its slot 30 s ago was never sent."""
    last_run = datetime.now(timezone.utc) - timedelta(seconds=90)
    RedBeatSchedulerEntry(
        "poll", "rbt.record", schedule(timedelta(minutes=1)), app=app, last_run_at=last_run
    ).save()
    return round(last_run.timestamp() * 1000)


def import_args(redis_url: str, app: Celery) -> tuple[str, ...]:
    return ("import", "redbeat", "--from", redis_url, "--prefix", app.redbeat_conf.key_prefix)


def test_a_cut_over_fires_an_overdue_interval_at_once_then_an_interval_later(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    # redbeat stores a run before it sends it: the slot 30 s ago, after its last stored run,
    # was never sent. The cut-over fires it at once, as a switch without staging does and
    # redbeat would on its restart (session 36; before, it was not fired: lost).
    last_run = stopped_90_s_ago(redbeat_app)
    args = import_args(redis_url, redbeat_app)
    assert run(*args, "--paused").exit_code == 0
    before = time.time() * 1000
    cut = run(*args, "--resume")
    assert cut.exit_code == 0 and "1 resumed" in cut.stderr, cut.output
    assert "not fired at the cut-over" not in cut.stderr
    poll = repeat.get("celery", "poll")
    assert poll is not None and not poll.paused and poll.next_run_ms is not None
    assert last_run + MINUTE_MS <= poll.next_run_ms <= time.time() * 1000  # due: at once
    assert poll.next_run_ms >= before - 5_000
    recorder = RecordingDispatcher()
    Pump(repeat, ["celery"], recorder).run_once()
    [fired] = recorder.occurrences
    after = repeat.get("celery", "poll")
    assert after is not None and after.next_run_ms == fired.due_ms + MINUTE_MS
    assert after.missed == 0


def test_a_direct_import_fires_an_overdue_interval_at_once_then_an_interval_later(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    last_run = stopped_90_s_ago(redbeat_app)
    args = import_args(redis_url, redbeat_app)
    before = time.time() * 1000
    assert run(*args).exit_code == 0
    poll = repeat.get("celery", "poll")
    assert poll is not None and poll.next_run_ms is not None
    assert before - 5 <= poll.next_run_ms <= time.time() * 1000  # due: at once
    recorder = RecordingDispatcher()
    Pump(repeat, ["celery"], recorder).run_once()
    [fired] = recorder.occurrences
    assert fired.due_ms == poll.next_run_ms
    after = repeat.get("celery", "poll")
    assert after is not None and after.next_run_ms is not None
    # An interval after the fire, as Celery's beat runs it (not the old rhythm's next slot,
    # 30 s after the fire), and nothing missed.
    assert after.next_run_ms == fired.due_ms + MINUTE_MS
    assert after.next_run_ms > last_run + 2 * MINUTE_MS
    assert after.missed == 0 and after.fired == 1 + (poll.fired or 0)
