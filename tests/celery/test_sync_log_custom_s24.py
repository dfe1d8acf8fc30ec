"""A sync's log lines name a Celery custom schedule (`relative=True`, `solar`, a class of its
own) as `list` does, `celery <...>`, not as the placeholder interval its record holds: an
audit of a deploy from its WARNING lines reads what was really removed or changed."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from celery import Celery
from celery.schedules import schedule

from emq_bridge import Repeat
from emq_bridge.celery.declare import sync_app


def _app(redis_url: str, prefix: str, beat_schedule: dict[str, object]) -> Celery:
    app = Celery("slc", broker="memory://", set_as_current=False)
    app.conf.update(
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        emq_bridge_boot_stamp=False,
        emq_bridge_check_tasks=False,
        beat_schedule=beat_schedule,
        result_backend=None,
        result_expires=None,
    )
    return app


def test_removed_and_changed_custom_schedules_are_named_as_list_names_them(
    redis_url: str, prefix: str, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    relative = {"task": "slc.tick", "schedule": schedule(timedelta(seconds=7), relative=True)}
    sync_app(_app(redis_url, prefix, {"rel": relative, "gone": relative}), repeat)

    changed = {"task": "slc.tick", "schedule": schedule(timedelta(seconds=9), relative=True)}
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        sync_app(_app(redis_url, prefix, {"rel": changed}), repeat)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "sync celery.slc: - celery/gone  (was celery <freq: 7.00 seconds>)" in lines
    changed_line = (
        "sync celery.slc: ~ celery/rel  celery <freq: 7.00 seconds> -> celery <freq: 9.00 seconds>"
    )
    assert any(line.startswith(changed_line) for line in lines), lines
