"""A deploy that moves a beat's schedules to another queue (here `task_default_queue`) logs
each as a move, not as a removal and a creation, and not as schedules removed by another app
sharing the registry. Before (session 27's Celery idioms probe), every entry logged
`- old/a (was ...)` at WARNING and `+ new/a`, and the sync ended with a WARNING that another
app under the same source might have removed them, when nothing was lost."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

from emq_bridge import Repeat
from emq_bridge.celery import sync_app


def app_on(queue: str, redis_url: str, prefix: str) -> Celery:
    app = Celery("movelog", set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        emq_bridge_check_tasks=False,
        beat_schedule={"a": {"task": "proj.a", "schedule": 60.0}},
    )
    return app


def test_a_queue_move_is_logged_as_a_move(
    repeat: Repeat, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    sync_app(app_on("old", redis_url, prefix), repeat)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        sync_app(app_on("new", redis_url, prefix), repeat)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any(line.endswith(": > old/a moved to queue new") for line in said), said
    assert not any(": - old/a" in line or ": + new/a" in line for line in said), said
    assert not any("another app shares this registry" in line for line in said), said
    assert "a" in repeat.names("new") and "a" not in repeat.names("old")
