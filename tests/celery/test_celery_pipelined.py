"""The opt-in pipelined Celery path: it writes what `apply_async` writes, and a real
`celery worker` process consumes it once per occurrence."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish

from emq_bridge import ConfigError, Occurrence, Pump, Repeat, occurrence_id
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000

APP = textwrap.dedent("""
    import json, os
    import redis
    from celery import Celery
    from emq_bridge.celery import nominal_due_ms

    app = Celery("emqp", broker=os.environ["EMQP_BROKER"])
    app.conf.update(result_backend=None, broker_connection_retry_on_startup=True)
    results = redis.Redis.from_url(os.environ["EMQP_BROKER"])

    @app.task(bind=True, name="emqp.record")
    def record(self, *args, **kwargs):
        results.rpush(os.environ["EMQP_RESULTS"], json.dumps({
            "id": self.request.id,
            "due": nominal_due_ms(self.request),
            "schedule": (self.request.headers or {}).get("emq_schedule")
                or getattr(self.request, "emq_schedule", None),
            "args": list(args),
            "kwargs": kwargs,
        }))
""")


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("emqp-test", broker=redis_url)
    app.conf.update(result_backend=None)
    yield app
    app.close()


def occurrence(
    queue: str, name: str, template: dict[str, Any], due_ms: int = T0, prefix: str = "emq"
) -> Occurrence:
    return Occurrence(
        queue=queue,
        name=name,
        due_ms=due_ms,
        id=occurrence_id(prefix, queue, name, due_ms),
        template=template,
        released_ms=due_ms,
    )


def pushed(client: redis.Redis, before: set[bytes]) -> list[tuple[bytes, bytes]]:
    """Return (key, payload) of every message kombu or the fast path has pushed since."""
    out = []
    for key in sorted(set(client.keys("*")) - before):
        if client.type(key) == b"list":
            out.extend((key, payload) for payload in reversed(client.lrange(key, 0, -1)))
            client.delete(key)
    return out


def without_tag(payload: bytes) -> dict[str, Any]:
    message = json.loads(payload)
    assert len(message["properties"].pop("delivery_tag")) == 36
    return dict(message)


TEMPLATES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"task": "emqp.record", "args": [1, 2], "kwargs": {"report": "daily"}}),
    ("prio", {"task": "emqp.record", "args": [], "options": {"priority": 5}}),
    ('héllo"\\name', {"task": "emqp.record", "args": ["ünï"], "kwargs": {"x": None}}),
    ("routed", {"task": "emqp.record", "options": {"queue": "other-q", "headers": {"h": 1}}}),
    ("unknown", {"task": "not.registered.anywhere", "args": [[1, {"a": 2}]]}),
]


@pytest.mark.parametrize(("name", "template"), TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_the_fast_path_writes_exactly_what_apply_async_writes(
    app: Celery, redis_url: str, name: str, template: dict[str, Any]
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    before = set(client.keys("*"))
    occ = occurrence(queue, name, template)

    CeleryDispatcher(app).dispatch(occ)
    normal = pushed(client, before)
    fast = PipelinedCeleryDispatcher(app)
    # Twice: the first builds the plan, the second uses it.
    assert fast.dispatch_batch([occ]) == [None]
    first = pushed(client, before)
    assert fast.dispatch_batch([occ]) == [None]
    second = pushed(client, before)
    fast.close()

    assert len(normal) == len(first) == len(second) == 1
    (key, expected), (key1, got1), (key2, got2) = normal[0], first[0], second[0]
    assert key == key1 == key2
    assert without_tag(got1) == without_tag(got2) == without_tag(expected)
    # Byte for byte, once the random delivery tag is set equal.
    tag = json.loads(expected)["properties"]["delivery_tag"]
    for got in (got1, got2):
        other = json.loads(got)["properties"]["delivery_tag"]
        assert got.replace(other.encode(), tag.encode()) == expected


def test_eta_expires_and_publish_signals_go_through_apply_async_one_by_one(
    app: Celery, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    before = set(client.keys("*"))
    expiring = occurrence(queue, "expiring", {"task": "emqp.record", "options": {"expires": 60}})
    plain = occurrence(queue, "plain", {"task": "emqp.record"})
    fast = PipelinedCeleryDispatcher(app)
    try:
        assert fast.dispatch_batch([expiring, plain]) == [None, None]
        messages = {
            json.loads(p)["headers"]["emq_schedule"]: json.loads(p)
            for _, p in pushed(client, before)
        }
        assert messages[f"{queue}/expiring"]["headers"]["expires"] is not None  # sent fresh
        assert messages[f"{queue}/plain"]["headers"]["id"] == plain.id

        seen: list[str] = []

        def watch(headers: dict[str, Any], **_: Any) -> None:
            seen.append(headers["id"])

        before_task_publish.connect(watch)
        try:
            later = [occurrence(queue, "plain", {"task": "emqp.record"}, T0 + i) for i in (1, 2)]
            assert fast.dispatch_batch(later) == [None, None]
        finally:
            before_task_publish.disconnect(watch)
        assert seen == [o.id for o in later]  # the receiver saw each message
        assert len(pushed(client, before)) == 2
    finally:
        fast.close()


def test_a_bad_template_fails_alone_and_the_rest_of_the_batch_is_sent(
    app: Celery, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    before = set(client.keys("*"))
    good = occurrence(queue, "good", {"task": "emqp.record"})
    bad = occurrence(queue, "bad", {"args": [1]})
    fast = PipelinedCeleryDispatcher(app)
    try:
        errors = fast.dispatch_batch([good, bad])
    finally:
        fast.close()
    assert errors[0] is None
    assert "template 'task' must be a non-empty string" in str(errors[1])
    assert [json.loads(p)["headers"]["id"] for _, p in pushed(client, before)] == [good.id]


def test_a_broker_that_is_down_fails_the_batch_quickly_and_nothing_is_cached() -> None:
    app = Celery("emqp-down", broker="redis://127.0.0.1:1/0")
    fast = PipelinedCeleryDispatcher(app)  # does not connect yet
    try:
        occ = occurrence("q", "n", {"task": "emqp.record"})
        started = time.monotonic()
        errors = fast.dispatch_batch([occ, occ])
        assert time.monotonic() - started < 5
        assert all("connecting" in str(e) or "Connection" in str(e) for e in errors)
        assert fast._plans == {}  # a later batch builds the plan afresh
    finally:
        fast.close()


def test_the_fast_path_refuses_a_broker_that_is_not_redis() -> None:
    app = Celery("emqp-memory", broker="memory://")
    with pytest.raises(ConfigError, match="needs a Redis broker"):
        PipelinedCeleryDispatcher(app)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_worker_runs_each_pipelined_occurrence_once_with_its_id(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "emqp_app.py").write_text(APP)
    queue = f"{prefix}-q"
    results = f"{prefix}:results"
    env = {"EMQP_BROKER": redis_url, "EMQP_RESULTS": results, "PYTHONPATH": str(tmp_path)}
    sys.path.insert(0, str(tmp_path))
    monkey_env = pytest.MonkeyPatch()
    for key, value in env.items():
        monkey_env.setenv(key, value)
    try:
        import emqp_app  # the same app the worker runs, so the task is known here too

        client = redis.Redis.from_url(redis_url)
        repeat = Repeat(client, prefix)
        names = [f"job-{i}" for i in range(300)] + ['odd"name\\é']
        for i, name in enumerate(names):
            options = {"priority": 9} if i % 50 == 0 else {}
            repeat.register(
                queue,
                name,
                every="1h",
                template={
                    "task": "emqp.record",
                    "args": [i],
                    "kwargs": {"name": name, "nested": {"of": [i, "ünï ✓", None]}},
                    "options": options,
                },
                now_ms=T0,
            )
        fast = PipelinedCeleryDispatcher(emqp_app.app)
        tick = Pump(repeat, [queue], fast, batch_size=128).run_once(now_ms=T0 + HOUR)
        fast.close()
        assert len(tick.dispatched) == len(names) and not tick.failed
        # Distinct arguments, two option sets: two plans (message skeletons), not 301.
        assert len([plan for plan in fast._plans.values() if plan is not None]) == 2

        import os

        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "emqp_app",
                "worker",
                "-P",
                "solo",
                "-Q",
                queue,
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                "-l",
                "warning",
            ],
            cwd=tmp_path,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 90
            while client.llen(results) < len(names) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)  # room for a duplicate to show up, if there were one
        finally:
            worker.terminate()
            _, stderr = worker.communicate(timeout=30)
        seen = [json.loads(raw) for raw in client.lrange(results, 0, -1)]
        assert len(seen) == len(names), stderr.decode()[-2000:]
        by_schedule = {entry["schedule"]: entry for entry in seen}
        for i, name in enumerate(names):
            entry = by_schedule[f"{queue}/{name}"]
            assert entry["id"] == occurrence_id(prefix, queue, name, T0 + HOUR)
            assert entry["due"] == T0 + HOUR
            assert entry["args"] == [i]
            assert entry["kwargs"] == {"name": name, "nested": {"of": [i, "ünï ✓", None]}}
    finally:
        monkey_env.undo()
        sys.path.remove(str(tmp_path))
        sys.modules.pop("emqp_app", None)
