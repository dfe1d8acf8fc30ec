"""A task whose own `apply_async` changes what it is given (a base class adding to a nested
kwarg, a common Celery pattern) is sent as under Celery's beat.

Before: the dispatcher gave `apply_async` shallow copies of the template's args and kwargs,
whose nested objects were the pump's shared read-only ones; the write raised, the send failed
with a `DispatchError` (not a permanent one), and the occurrence was re-sent every lease,
never reaching the broker (a probe saw 76 error lines in 70 s, nothing sent). Real servers:
the registry is the test Redis, the broker the same server under another database.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, Task

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
HOUR = 3_600_000


class TenantTask(Task):  # type: ignore[misc]
    """Adds the tenant to the nested `ctx` kwarg and a tag to the nested list arg."""

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        kwargs = dict(kwargs or {})
        kwargs.setdefault("ctx", {})["tenant"] = "acme"
        if args:
            args[0].append("tagged")
        return super().apply_async(args, kwargs, **options)


def tenant(tags: list[str], ctx: dict[str, str] | None = None) -> None:
    return None


@pytest.fixture
def broker_url(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + "/9"


@pytest.fixture
def app(broker_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"app-{prefix}", broker=broker_url, set_as_current=False)
    app.conf.update(result_backend=None, task_default_queue=f"{prefix}-q")
    app.task(name="t.tenant", base=TenantTask, shared=False)(tenant)
    yield app
    app.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_a_task_that_changes_its_nested_arguments_is_sent(
    repeat: Repeat, app: Celery, broker_url: str, prefix: str, pipelined: bool
) -> None:
    template = {"task": "t.tenant", "args": [["a"]], "kwargs": {"ctx": {"user": "u1"}}}
    for name in ("one", "two"):  # two occurrences share the decoded template
        repeat.register(prefix, name, every="1h", template=template, now_ms=T0)
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    tick = Pump(repeat, [prefix], dispatcher).run_once(T0 + HOUR)
    assert sorted(o.name for o in tick.dispatched) == ["one", "two"]
    broker = redis.Redis.from_url(broker_url)
    try:
        bodies = [
            json.loads(base64.b64decode(json.loads(raw)["body"]))
            for raw in broker.lrange(prefix, 0, -1)
        ]
        broker.delete(prefix)
    finally:
        broker.close()
    assert len(bodies) == 2
    for args, kwargs, _ in bodies:
        assert kwargs == {"ctx": {"user": "u1", "tenant": "acme"}}
        assert args == [["a", "tagged"]]  # each its own copy: tagged once
    # The stored template is untouched.
    stored = repeat.get(prefix, "one").definition.template
    assert stored["kwargs"] == {"ctx": {"user": "u1"}} and stored["args"] == [["a"]]
