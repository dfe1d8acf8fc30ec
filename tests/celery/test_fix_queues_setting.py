"""`emq_bridge_queues` is checked with everything else an app declares, before anything is
written: a string was pumped as one queue a letter ('extra' -> a, e, r, t, x), and a bad
queue name killed the beat with a traceback after its sync had written."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from emq_bridge import ConfigError
from emq_bridge.celery.declare import app_schedule


def app_with(queues: Any) -> Celery:
    app = Celery("q", set_as_current=False)
    app.conf.update(
        emq_bridge_queues=queues,
        beat_schedule={"tick": {"task": "q.tick", "schedule": 60.0}},
        emq_bridge_check_tasks=False,
        result_backend=None,
        result_expires=None,
    )
    return app


@pytest.mark.parametrize(
    ("queues", "match"),
    [
        ("extra", "emq_bridge_queues must be a list of queue names, got str 'extra'"),
        (5, "emq_bridge_queues must be a list of queue names, got int"),
        (["ok", "bad name"], "emq_bridge_queues: queue 'bad name' must not contain whitespace"),
    ],
)
def test_a_bad_queues_setting_is_a_config_error(queues: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        app_schedule(app_with(queues))


def test_a_list_of_queues_is_pumped() -> None:
    assert {"extra", "more"} <= set(app_schedule(app_with(["extra", "more"])).queues)
