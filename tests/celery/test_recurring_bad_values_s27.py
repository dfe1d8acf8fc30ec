"""`@recurring`'s `args`, `kwargs` and `options` are checked as a template checks them.

`args="abc"` was taken as the three arguments `('a', 'b', 'c')` (`tuple(args)`), and
`kwargs=[1]`, `options="x"` or `args=5` raised a bare `TypeError` or `ValueError` from
`dict()`/`tuple()`, where the decorator promises a `ScheduleError`. Now each is one
`ScheduleError` line at decoration, and nothing is declared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge import Repeat, ScheduleError
from emq_bridge.celery import recurring, sync_app
from emq_bridge.celery.declare import _DECLARED


def record(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(
        timezone="UTC",
        task_default_queue=f"{prefix}-q",
        emq_bridge_prefix=prefix,
        result_backend=None,
        result_expires=None,
    )
    app.task(name="t.record", shared=False)(record)
    mark = len(_DECLARED)
    yield app
    del _DECLARED[mark:]
    app.close()


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"args": "abc"}, "args must be a list or tuple, got str"),
        ({"args": b"abc"}, "args must be a list or tuple, got bytes"),
        ({"args": 5}, "args must be a list or tuple, got int"),
        ({"args": {"a": 1}}, "args must be a list or tuple, got dict"),
        ({"kwargs": [1]}, "kwargs must be a dict, got list"),
        ({"kwargs": "k=1"}, "kwargs must be a dict, got str"),
        ({"options": "x"}, "options must be a dict, got str"),
        ({"options": 1.5}, "options must be a dict, got float"),
    ],
)
def test_a_wrong_typed_argument_is_one_schedule_error_line(
    values: dict[str, Any], error: str
) -> None:
    declared = len(_DECLARED)
    with pytest.raises(ScheduleError) as raised:
        recurring(every="1m", **values)
    assert str(raised.value) == error
    assert len(_DECLARED) == declared


def test_a_list_or_tuple_of_arguments_and_dicts_are_synced_as_given(
    app: Celery, client: redis.Redis, prefix: str
) -> None:
    recurring(every="1m", args=["abc", 2], kwargs={"k": 1}, options={"priority": 3})(
        app.tasks["t.record"]
    )
    sync_app(app, beat=False)
    stored = Repeat(client, prefix).get(f"{prefix}-q", "t.record")
    assert stored is not None
    template = stored.definition.template
    assert template["args"] == ["abc", 2] and template["kwargs"] == {"k": 1}
    assert template["options"]["priority"] == 3


def needs_one(n: int) -> int:
    return n


def test_arguments_the_task_refuses_stop_the_sync_naming_the_task(
    app: Celery, client: redis.Redis, prefix: str
) -> None:
    # Session 35 (a probe of the typed public API): a `@recurring` whose args the task does
    # not take synced, and its first send parked it (for a daily schedule, a day later).
    # The task is in hand when the beat or a worker converts it: refused there, with
    # Celery's own check (`Task.typing`), and nothing is written.
    from emq_bridge import ConfigError

    task = app.task(name="t.needs_one", shared=False)(needs_one)
    recurring(every="1m", args=[1, 2, 3])(task)
    with pytest.raises(ConfigError) as raised:
        sync_app(app, beat=False)
    assert str(raised.value).startswith(
        "@recurring on t.needs_one: its args and kwargs do not fit task 't.needs_one': "
    )
    assert Repeat(client, prefix).names(f"{prefix}-q") == []
    untyped = app.task(name="t.untyped", shared=False, typing=False)(needs_one)
    recurring(every="1m", args=[1, 2, 3])(untyped)  # Celery checks nothing: nor does this
    del _DECLARED[-2]
    sync_app(app, beat=False)
    assert Repeat(client, prefix).names(f"{prefix}-q") == ["t.untyped"]
