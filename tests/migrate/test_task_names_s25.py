"""A task name holding a line break or a control character is refused by every way in, as
a schedule file and `add` refuse it (found by a probe): a celery-redbeat entry was imported
with it, and a `beat_schedule` entry synced, and `export` then left such a schedule out."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry

from emq_bridge import ConfigError, Repeat
from emq_bridge.celery import app_schedule


def test_a_redbeat_entry_whose_task_holds_a_line_break_is_refused(
    run: Run, repeat: Repeat, redis_url: str
) -> None:
    key_prefix = f"rb{uuid.uuid4().hex[:8]}:"
    app = Celery("rbt", broker=redis_url, set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, redbeat_key_prefix=key_prefix)
    every = schedule(timedelta(minutes=1))
    RedBeatSchedulerEntry("good", "rbt.record", every, app=app).save()
    RedBeatSchedulerEntry("bad", "rbt.record\nrbt.other", every, app=app).save()
    result = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert result.exit_code == 0, result.output
    refused = [line for line in result.stdout.splitlines() if line.startswith("!")]
    assert len(refused) == 1 and refused[0].startswith(f"! redbeat {key_prefix}bad: "), refused
    assert "must not contain control characters" in refused[0]
    assert "1 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
    assert repeat.names("celery") == ["good"]


@pytest.mark.parametrize("task", ["proj.run\nproj.other", "proj.\x1b[31mrun"])
def test_a_beat_schedule_entry_whose_task_holds_a_control_character_is_refused(
    task: str,
) -> None:
    app = Celery("names", set_as_current=False)
    app.conf.update(
        beat_schedule={"bad": {"task": task, "schedule": 60.0}},
        emq_bridge_check_tasks=False,
    )
    with pytest.raises(ConfigError, match="must not contain control characters"):
        app_schedule(app)
