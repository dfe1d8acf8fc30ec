"""A plain `beat_schedule` entry (Celery's keys, an interval) is converted without building
Celery's objects: it must give what the full path gives, and refuse what it refuses, with the
same error."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from emq_bridge.celery.entries import Entries, convert_entry
from emq_bridge.definition import Definition, _digest
from emq_bridge.errors import ConfigError


def noop(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def app() -> Celery:
    app = Celery("plain", set_as_current=False)
    app.conf.timezone = "UTC"
    app.conf.result_expires = None
    app.task(name="t.plain", shared=False)(noop)
    return app


PLAIN: dict[str, dict[str, Any]] = {
    "td": {"task": "t.plain", "schedule": timedelta(minutes=5), "args": [1, 2]},
    "int": {"task": "t.plain", "schedule": 30, "kwargs": {"tenant": "t1", "limit": 100}},
    "float": {"task": "t.plain", "schedule": 0.5, "options": {"queue": "low", "expires": 30}},
    "tuple-args": {"task": "t.plain", "schedule": 60, "args": (1, [2, {"a": None}])},
    "none-parts": {"task": "t.plain", "schedule": 60, "args": None, "kwargs": None},
    "utf8": {"task": "t.plain", "schedule": 60, "kwargs": {"é": "€\u2028"}},
    "a key with spaces {}": {"task": "t.plain", "schedule": 10},  # its name is made valid
    "clé": {"task": "t.plain", "schedule": 10},
    "x" * 201: {"task": "t.plain", "schedule": 10},  # cut short, with a digest of it all
}
REFUSED: dict[Any, dict[str, Any]] = {
    "nan": {"task": "t.plain", "schedule": math.nan},
    "huge": {"task": "t.plain", "schedule": 1e30},
    "zero": {"task": "t.plain", "schedule": 0},
    "negative": {"task": "t.plain", "schedule": -5},
    "sub-ms": {"task": "t.plain", "schedule": 1e-7},
    "millennia": {"task": "t.plain", "schedule": timedelta(days=10**6)},
    "bool": {"task": "t.plain", "schedule": True},
    "string": {"task": "t.plain", "schedule": "10"},
    "blank-task": {"task": "  ", "schedule": 10},
    "no-task": {"schedule": 10},
    "unknown-task": {"task": "t.nope", "schedule": 10},
    "int-key": {"task": "t.plain", "schedule": 10, "kwargs": {1: 2}},
    "not-json": {"task": "t.plain", "schedule": 10, "args": [datetime(2020, 1, 1)]},
    "infinite": {"task": "t.plain", "schedule": 10, "args": [math.inf]},
    "task-id": {"task": "t.plain", "schedule": 10, "options": {"task_id": "x"}},
    "bad-queue": {"task": "t.plain", "schedule": 10, "options": {"queue": 5}},
    # What Celery's `apply_async` refuses at every send (a TypeError): refused at boot, with
    # the entry named, not a string's characters sent as args nor a bare error.
    "args-str": {"task": "t.plain", "schedule": 10, "args": "ab"},
    "args-int": {"task": "t.plain", "schedule": 10, "args": 5},
    "kwargs-str": {"task": "t.plain", "schedule": 10, "kwargs": "abc"},
    "kwargs-pairs": {"task": "t.plain", "schedule": 60, "kwargs": [("a", 1)]},
    "options-str": {"task": "t.plain", "schedule": 10, "options": "x"},
}


def full_path(raw: dict[str, Any]) -> dict[str, Any]:
    """The same entry with a key of emq-bridge's at its default: the path through Celery's
    `ScheduleEntry`."""
    return {**raw, "overlap": "allow"}


def described(definition: Definition) -> tuple[Any, ...]:
    return (definition.digest, definition.cadence_digest, definition.to_fields())


@pytest.mark.parametrize("key", sorted(PLAIN))
def test_a_plain_entry_converts_as_through_celerys_objects(app: Celery, key: str) -> None:
    context = Entries(app)
    fast, custom = convert_entry(app, key, PLAIN[key], context=context)
    full, _ = convert_entry(app, key, full_path(PLAIN[key]), context=context)

    assert custom is None
    assert (fast.queue, fast.name) == (full.queue, full.name)
    assert described(fast.definition) == described(full.definition)
    assert fast.definition.digest == _digest(fast.definition.to_fields())


@pytest.mark.parametrize("key", sorted(REFUSED, key=str))
def test_a_bad_plain_entry_is_refused_with_the_full_paths_error(app: Celery, key: Any) -> None:
    def error(raw: dict[str, Any]) -> tuple[type[BaseException], str]:
        with pytest.raises(Exception) as caught:
            convert_entry(app, key, raw, context=Entries(app))
        return caught.type, str(caught.value)

    kind, message = error(REFUSED[key])
    assert (kind, message) == error(full_path(REFUSED[key]))
    assert issubclass(kind, ConfigError)
    assert message.startswith("beat_schedule[") and "\n" not in message


def test_a_plain_entry_leaves_the_configured_values_alone(app: Celery) -> None:
    args, kwargs = [1, 2], {"a": [3]}
    declaration, _ = convert_entry(
        app, "own", {"task": "t.plain", "schedule": 60, "args": args, "kwargs": kwargs}
    )

    assert declaration.definition.template["args"] is not args
    assert declaration.definition.template["kwargs"] is not kwargs
    assert (args, kwargs) == ([1, 2], {"a": [3]})
