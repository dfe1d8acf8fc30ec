"""A `beat_schedule` converted in one pass (`app_schedule`) reads the app's settings, tasks
and routing once: each entry must still land where Celery would send it."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from kombu.entity import Queue

from emq_bridge.celery import app_schedule
from emq_bridge.errors import ConfigError


def make_app(**conf: Any) -> Celery:
    app = Celery("boot", set_as_current=False)
    app.conf.timezone = "UTC"
    app.conf.result_expires = None  # no `celery.backend_cleanup` entry: only the ones given
    app.conf.update(conf)
    app.task(name="t.plain", shared=False)(noop)
    app.task(name="t.other", shared=False)(noop)
    return app


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def queues_of(app: Celery) -> dict[str, str]:
    return {d.name: d.queue for d in app_schedule(app).declarations}


def test_entries_go_to_their_queue_option_or_the_default_queue() -> None:
    app = make_app()
    app.conf.beat_schedule = {
        "a": {"task": "t.plain", "schedule": 60, "args": [1]},
        "b": {"task": "t.plain", "schedule": 60, "args": [2], "options": {"queue": "low"}},
        "c": {"task": "t.other", "schedule": crontab(minute="*/5"), "args": [3]},
        "d": {"task": "t.other", "schedule": 60, "options": {"queue": Queue("low")}},  # type: ignore[no-untyped-call]
        "e": {"task": "t.plain", "schedule": 30, "args": [5]},
    }

    assert queues_of(app) == {"a": "celery", "b": "low", "c": "celery", "d": "low", "e": "celery"}


def test_a_route_on_the_arguments_routes_each_entry_on_its_own() -> None:
    def by_parity(name: str, args: Any, kwargs: Any, options: Any, **_: Any) -> dict[str, str]:
        return {"queue": "odd" if args[0] % 2 else "even"}

    app = make_app(task_routes=(by_parity,))
    app.conf.beat_schedule = {
        f"job-{i}": {"task": "t.plain", "schedule": 60, "args": [i]} for i in range(4)
    }

    assert queues_of(app) == {"job-0": "even", "job-1": "odd", "job-2": "even", "job-3": "odd"}


def test_an_unknown_queue_fails_every_entry_that_names_it() -> None:
    app = make_app(task_create_missing_queues=False, task_queues=[Queue("celery")])  # type: ignore[no-untyped-call]
    app.conf.beat_schedule = {"a": {"task": "t.plain", "schedule": 60, "options": {"queue": "x"}}}
    for _ in range(2):  # nothing is remembered from the failure
        with pytest.raises(ConfigError, match=r"cannot route task 't\.plain'"):
            app_schedule(app)


def test_the_cron_deadline_and_the_task_check_are_read_when_converting() -> None:
    app = make_app(beat_cron_starting_deadline=120)
    app.conf.beat_schedule = {
        "cron": {"task": "t.plain", "schedule": crontab(minute=0)},
        "every": {"task": "t.plain", "schedule": 60},
    }
    windows = {d.name: d.definition.catchup_window_ms for d in app_schedule(app).declarations}
    assert windows == {"cron": 120_000, "every": None}

    app.conf.beat_schedule = {"x": {"task": "t.missing", "schedule": 60}}
    with pytest.raises(ConfigError, match=r"unknown task 't\.missing'"):
        app_schedule(app)
    app.conf.emq_bridge_check_tasks = False
    assert [d.name for d in app_schedule(app).declarations] == ["x"]
