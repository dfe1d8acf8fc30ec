"""A custom Celery schedule whose repr spans lines (django-celery-beat's `TzAwareCrontab`,
any class of one's own) is shown on one line: its label collapses each whitespace run to
one space, so `emq-bridge list` keeps one row per schedule."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from celery import Celery
from celery.schedules import schedstate, schedule
from cli_run import Run
from django_celery_beat.tzcrontab import TzAwareCrontab

from emq_bridge import Repeat
from emq_bridge.celery import sync_app


class Spread(schedule):  # type: ignore[misc]
    """A schedule of one's own whose repr holds newlines, tabs and runs of spaces."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(False, 3600.0)

    def __repr__(self) -> str:
        return "<spread:\n\tevery   hour\n  on the\r\n hour>\n"


def test_a_multi_line_repr_is_one_line_in_the_registry_and_in_list(
    run: Run, repeat: Repeat, redis_url: str, prefix: str
) -> None:
    queue = f"{prefix}-q"
    app = Celery("oneline", broker=redis_url, set_as_current=False)
    paris = TzAwareCrontab(minute=0, hour=9, tz=ZoneInfo("Europe/Paris"))
    assert "\n" in repr(paris)  # what the tester saw break the table
    app.conf.update(
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        emq_bridge_check_tasks=False,
        task_default_queue=queue,
        beat_schedule={
            "paris": {"task": "t.record", "schedule": paris},
            "spread": {"task": "t.record", "schedule": Spread(timedelta(hours=1))},
        },
    )
    sync_app(app, repeat)

    shown = {
        name: repeat.get(queue, name).definition.template["schedule"]  # type: ignore[union-attr]
        for name in ("paris", "spread")
    }
    assert shown == {
        "paris": "celery <crontab: 0 9 * * * (m/h/d/dM/MY), Europe/Paris>",
        "spread": "celery <spread: every hour on the hour>",
    }
    listed = run("list", queue)
    assert listed.exit_code == 0, listed.output
    rows = listed.stdout.splitlines()
    for text in shown.values():
        assert sum(text in row for row in rows) == 1, listed.stdout  # whole, on one row
    assert not any(row.strip().startswith(("*", "on the", "hour>")) for row in rows), rows
