"""Session 28: a `beat_schedule` entry's dicts reach the task in the order the user wrote
them, through the registry and either dispatcher, as Celery's own beat sends them.

Earlier releases stored the template with its keys sorted at every depth, so a task that
reads its columns or steps from a dict got them sorted. Here the same entries are sent by
Celery's beat (`Scheduler.apply_async`, what `PersistentScheduler` runs) and by emq-bridge
(converted, synced into the registry, claimed by a pump, published by `CeleryDispatcher` or
`PipelinedCeleryDispatcher`) to the embedded Redis broker, and the bodies read back from it
hold the same args, kwargs and callbacks, key order included.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, Task, signals
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import crontab
from kombu import Producer

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher
from emq_bridge.celery.declare import sync_app
from emq_bridge.celery.pipelined import Plan

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
DAY = 86_400_000
TASK = "k28.report"
COLUMNS = {"name": "Name", "email": "E-mail", "age": "Age"}
STEPS = {"zeta": 1, "alpha": 2, "mid": {"y": [{"z": 1, "a": {"q": 0, "b": 1}}], "b": None}}


def entries() -> dict[str, dict[str, Any]]:
    """Fresh entries (Celery's beat and the conversion each get their own copies)."""
    return {
        # A plain entry: `_convert_plain`'s path.
        "plain": {
            "task": TASK,
            "schedule": 60.0,
            "args": [dict(COLUMNS), [{"z": 1, "a": 2}]],
            "kwargs": {"options": json.loads(json.dumps(STEPS)), "b": 1, "a": 2},
        },
        # A crontab and a callback signature (a dict in options): the full conversion path.
        "linked": {
            "task": TASK,
            "schedule": crontab(minute="*/5"),
            "args": [dict(COLUMNS)],
            "kwargs": {"z": {"y": 2, "b": 3}, "a": 1},
            "options": {
                "link": {
                    "task": TASK,
                    "args": [],
                    "kwargs": {"zeta": 1, "alpha": {"y": 1, "b": 2}},
                    "options": {},
                    "subtask_type": None,
                    "immutable": False,
                },
                "priority": 3,
            },
        },
    }


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery("k28", broker=redis_url, set_as_current=False)
    app.conf.update(
        result_backend=None,
        result_expires=None,  # no `celery.backend_cleanup` entry
        task_default_queue=f"{prefix}-q",
        beat_schedule=entries(),
        timezone="UTC",
    )

    @app.task(name=TASK, shared=False)
    def report(*args: Any, **kwargs: Any) -> None:
        """Takes anything."""

    yield app
    app.close()


def drain(client: redis.Redis, queue: str) -> list[list[Any]]:
    """The bodies (`[args, kwargs, embed]`) of the messages on the lists of `queue` (its
    priority lists too), list by list, oldest first, decoded as a worker decodes them (order
    kept); the lists emptied."""
    bodies = []
    for key in sorted(client.keys(f"{queue}*")):
        for payload in reversed(client.lrange(key, 0, -1)):
            message = json.loads(payload)
            body = message["body"]
            if message["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            bodies.append(json.loads(body))
        client.delete(key)
    return bodies


def as_sent(body: list[Any]) -> str:
    """The args, kwargs and callbacks of a body as JSON text: equal texts, equal orders."""
    args, kwargs, embed = body
    return json.dumps([args, kwargs, embed.get("callbacks")])


def celery_beat_bodies(app: Celery, client: redis.Redis, queue: str) -> dict[str, str]:
    """What Celery's own beat publishes for each entry (`Scheduler.apply_async`)."""
    out = {}
    for name, raw in entries().items():
        entry = ScheduleEntry(name=name, app=app, **raw)
        Scheduler(app, lazy=True).apply_async(entry)
        [body] = drain(client, queue)
        out[name] = as_sent(body)
    return out


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_the_dicts_of_an_entry_reach_the_broker_in_celery_beats_order(
    app: Celery, client: redis.Redis, prefix: str, pipelined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What another test of this worker process left behind (sentry-sdk's Celery integration,
    # once initialised, wraps `Task.apply_async` and kombu's `Producer.publish` to add its
    # trace headers, and may leave publish receivers) sends everything through the normal
    # path, which this test's pipelined case is not about: Celery's own, for this test.
    for signal in (signals.before_task_publish, signals.after_task_publish, signals.task_sent):
        monkeypatch.setattr(signal, "receivers", [])
    for owner, name in ((Task, "apply_async"), (Celery, "send_task"), (Producer, "publish")):
        wrapped = getattr(getattr(owner, name), "__wrapped__", None)
        if wrapped is not None:
            monkeypatch.setattr(owner, name, wrapped)
    queue = f"{prefix}-q"
    expected = celery_beat_bodies(app, client, queue)
    # The order the user wrote, as Celery's beat sends it (not sorted).
    args, kwargs, _ = json.loads(expected["plain"])
    assert list(args[0]) == ["name", "email", "age"]
    assert list(kwargs) == ["options", "b", "a"]
    assert list(kwargs["options"]) == ["zeta", "alpha", "mid"]
    assert list(kwargs["options"]["mid"]["y"][0]["a"]) == ["q", "b"]

    repeat = Repeat(client, prefix, clock=lambda: T0)
    [plan] = [p for p in sync_app(app, repeat) if p.create]
    assert sorted(d.name for d in plan.create) == ["linked", "plain"]
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    try:
        tick = Pump(repeat, [queue], dispatcher).run_once(now_ms=T0 + DAY)
    finally:
        if isinstance(dispatcher, PipelinedCeleryDispatcher):
            dispatcher.close()
    assert sorted(o.name for o in tick.dispatched) == ["linked", "plain"]
    assert not tick.failed
    if isinstance(dispatcher, PipelinedCeleryDispatcher):  # the plain entry took a plan
        assert any(isinstance(p, Plan) for p in dispatcher._plans.values())
    sent = {}
    for body in drain(client, queue):
        name = "linked" if body[2].get("callbacks") else "plain"
        sent[name] = as_sent(body)
    assert sent == expected


def test_a_reordered_entry_is_rewritten_and_then_sent_in_its_new_order(
    app: Celery, client: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}-q"
    repeat = Repeat(client, prefix, clock=lambda: T0)
    sync_app(app, repeat)
    score = client.zscore(repeat.keys(queue).registry, "plain")
    reordered = entries()
    steps = {"mid": STEPS["mid"], "zeta": 1, "alpha": 2}
    reordered["plain"]["kwargs"] = {"b": 1, "options": steps, "a": 2}
    assert reordered == entries()  # the same entries but for the order of their keys
    app.conf.beat_schedule = reordered
    plans = sync_app(app, repeat)
    assert [d.name for p in plans for d in p.update] == ["plain"]
    assert client.zscore(repeat.keys(queue).registry, "plain") == score  # the cadence kept
    assert sum(len(p.unchanged) for p in plans) == 1  # "linked"
    Pump(repeat, [queue], CeleryDispatcher(app)).run_once(now_ms=T0 + DAY)
    [plain] = [body for body in drain(client, queue) if not body[2].get("callbacks")]
    assert json.dumps(plain[1]) == json.dumps({"b": 1, "options": steps, "a": 2})
    assert list(plain[1]) == ["b", "options", "a"]
    assert list(plain[1]["options"]) == ["mid", "zeta", "alpha"]
