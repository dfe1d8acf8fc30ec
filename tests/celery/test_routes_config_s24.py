"""A `beat_schedule` entry routed only by Celery's configuration (`task_routes`, a router
function, `task_queues`, `task_default_*`) is delivered where Celery's own beat delivers it.

Celery's beat calls `apply_async(args, kwargs, **entry.options)` and Celery's router
(`celery.app.routes.Router.route`) does the rest. The dispatcher sent such a task with
`queue=<registry queue>`, a name: Celery then looks the name up in `task_queues` (or creates
a plain direct queue of that name) and that queue wins over the route's own (`lpmerge`
keeps the caller's options). A kombu `Queue` given by a route (a `task_routes` map or a
router function, or a task's `queue` option) lost its exchange, routing key and arguments:
the task went through the default exchange to that one queue only, never to the other
queues bound to the route's exchange, and a queue with arguments (`x-max-priority`) failed
every send on RabbitMQ (`PRECONDITION_FAILED - inequivalent arg 'x-max-priority'`). A route
with an exchange and routing key but no queue also declared the default queue on every
connection, which Celery's beat never declares. Now a task whose routing names its registry
queue is sent as Celery's beat sends it; one in another queue (added by the CLI or the API)
still goes to that queue by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import NotFound
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from kombu import Connection, Exchange, Queue
from processes import stop, wait_until
from publish_spy import published

from emq_bridge.celery.dispatch import CeleryDispatcher
from emq_bridge.celery.entries import convert_entry
from emq_bridge.occurrence import Occurrence
from emq_bridge.template import freeze

EVENTS = Exchange("events", type="topic")


def record(*args: Any) -> None:
    return None


def by_args(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> Any:
    """A router function: the queue depends on the arguments."""
    if name == "t.record" and args and args[0] == "fn":
        return {"queue": Queue("fn", EVENTS, "r.fn", queue_arguments={"x-max-priority": 5})}
    if name == "t.record" and args and args[0] == "fnx":
        return {"exchange": "events", "exchange_type": "topic", "routing_key": "r.fnx"}
    return None


# Each case: the app's settings, and the task's own options.
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "task_routes to a task_queues name": (
        {
            "task_queues": [Queue("reports", EVENTS, "r.#"), Queue("audit", EVENTS, "r.#")],
            "task_routes": {"t.record": {"queue": "reports"}},
        },
        {},
    ),
    "task_routes name and routing key": (
        {
            "task_queues": [Queue("reports", EVENTS, "r.#")],
            "task_routes": {"t.record": {"queue": "reports", "routing_key": "r.keyed"}},
        },
        {},
    ),
    "task_routes exchange, no queue": (
        {
            "task_routes": {
                "t.record": {"exchange": "events", "exchange_type": "topic", "routing_key": "r.x"}
            }
        },
        {},
    ),
    "task_routes kombu Queue": (
        {"task_routes": {"t.record": {"queue": Queue("qobj", EVENTS, routing_key="r.qobj")}}},
        {},
    ),
    "task_routes glob to a kombu Queue with arguments": (
        {
            "task_routes": {
                "t.*": {
                    "queue": Queue("prio", EVENTS, "r.prio", queue_arguments={"x-max-priority": 9})
                }
            }
        },
        {},
    ),
    "task_routes kombu Queue named as a task_queues queue": (
        {
            "task_queues": [Queue("reports", EVENTS, "r.#")],
            "task_routes": {"t.record": {"queue": Queue("reports", EVENTS, "r.other")}},
        },
        {},
    ),
    "router function to a kombu Queue": ({"task_routes": (by_args,)}, {"args": ["fn"]}),
    "router function to an exchange": ({"task_routes": (by_args,)}, {"args": ["fnx"]}),
    "router function that declines": ({"task_routes": (by_args,)}, {"args": ["other"]}),
    "task_default settings": (
        {
            "task_default_queue": "dq",
            "task_default_exchange": "events",
            "task_default_exchange_type": "topic",
            "task_default_routing_key": "r.default",
        },
        {},
    ),
    "a task's own kombu Queue": ({}, {"task_queue": Queue("own", EVENTS, "r.own")}),
}


def make_app(settings: dict[str, Any], task_queue: Any = None) -> Celery:
    app = Celery("routes-config", broker="memory://", set_as_current=False)
    app.conf.update(timezone="UTC", result_backend=None, result_expires=None, **settings)
    own = {} if task_queue is None else {"queue": task_queue}  # deprecated by Celery 5.7
    app.task(name="t.record", shared=False, **own)(record)
    return app


def stored_occurrence(app: Celery, key: str, raw: dict[str, Any], queue: str = "") -> Occurrence:
    """The occurrence of `raw` as the registry holds it (in `queue` if given)."""
    declaration, _ = convert_entry(app, key, raw)
    stored = json.loads(json.dumps(dict(declaration.definition.template)))
    return Occurrence(
        queue=queue or declaration.queue,
        name=declaration.name,
        due_ms=0,
        id=str(uuid.uuid4()),
        template=freeze(stored),
        released_ms=0,
    )


@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_a_task_routed_by_the_app_is_published_as_celery_beat_publishes_it(case: str) -> None:
    settings, extra = CASES[case]
    app = make_app(settings, extra.get("task_queue"))
    raw = {"task": "t.record", "schedule": 5.0, "args": extra.get("args", [1])}
    entry = ScheduleEntry(name="e", app=app, **raw)
    celery_beat = published(lambda: Scheduler(app, lazy=True).apply_async(entry))
    dispatcher = CeleryDispatcher(app)
    occurrence = stored_occurrence(app, "e", raw)
    emq = published(lambda: dispatcher.dispatch(occurrence))
    assert len(celery_beat) == 1
    assert emq == celery_beat
    assert published(lambda: dispatcher.dispatch(occurrence)) == celery_beat  # known route


def test_a_schedule_in_a_queue_its_routing_does_not_name_goes_there_by_name() -> None:
    """`emq-bridge add elsewhere/x --task t.record`: the registry's queue, as before."""
    settings, _ = CASES["task_routes kombu Queue"]
    app = make_app(settings)
    raw = {"task": "t.record", "schedule": 5.0, "args": [1]}
    occurrence = stored_occurrence(app, "e", raw, queue="elsewhere")
    [(exchange, routing_key, _, declared)] = published(
        lambda: CeleryDispatcher(app).dispatch(occurrence)
    )
    assert (exchange, routing_key) == ("", "elsewhere")
    assert [entity["name"] for entity in declared] == ["elsewhere"]


def test_a_router_function_is_asked_at_each_send() -> None:
    """A router that reads the arguments: two schedules of one task in one queue, one that
    its routing names and one it does not, are each routed on their own."""
    app = make_app({"task_routes": (by_args,)})
    named = stored_occurrence(app, "a", {"task": "t.record", "schedule": 5.0, "args": ["fn"]})
    other = stored_occurrence(
        app, "b", {"task": "t.record", "schedule": 5.0, "args": ["x"]}, queue="fn"
    )
    dispatcher = CeleryDispatcher(app)
    assert [p[:2] for p in published(lambda: dispatcher.dispatch(named))] == [("events", "r.fn")]
    assert [p[:2] for p in published(lambda: dispatcher.dispatch(other))] == [("", "fn")]


# ---------------------------------------------------------------------------------------
# Celery's own `celery beat`, then a real `celery beat -S emq`, on RabbitMQ.

APP = textwrap.dedent("""
    import os
    from celery import Celery
    from kombu import Exchange, Queue

    env = os.environ
    p = env["S24_NAMES"]
    app = Celery("s24routes", broker=env["S24_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["S24_REDIS"],
        emq_bridge_prefix=env["S24_PREFIX"],
        task_default_queue=f"{p}_default",
        result_backend=None,
        result_expires=None,
        timezone="UTC",
        beat_max_loop_interval=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True},
    )
    topic = Exchange(f"{p}_topic", type="topic")
    app.conf.task_queues = [Queue(f"{p}_reports", topic, routing_key="r.#")]


    def router(name, args, kwargs, options, task=None, **kw):
        if name == "s24.fn":
            return {"queue": Queue(f"{p}_fn", topic, routing_key="r.fn")}
        return None


    app.conf.task_routes = (
        {
            "s24.report": {"queue": f"{p}_reports"},
            "s24.qobj": {"queue": Queue(f"{p}_qobj", topic, routing_key="r.qobj",
                                        queue_arguments={"x-max-priority": 5})},
            "s24.exonly": {"exchange": f"{p}_topic", "exchange_type": "topic",
                           "routing_key": "r.exonly"},
        },
        router,
    )


    def record(label):
        return label


    TASKS = ("s24.report", "s24.qobj", "s24.exonly", "s24.fn")
    for name in TASKS:
        app.task(name=name, shared=False)(record)
    app.conf.beat_schedule = {
        name.split(".")[1]: {"task": name, "schedule": 1.0, "args": [name]} for name in TASKS
    }
""")
TASKS = {"s24.report", "s24.qobj", "s24.exonly", "s24.fn"}
QUEUES = ("audit", "reports", "qobj", "fn", "default")


@pytest.fixture
def names(rabbitmq_url: str) -> Iterator[str]:
    """A unique `s24r_` prefix of queue and exchange names; what the test declared (and
    what the old code declared) is deleted."""
    value = f"s24r_{uuid.uuid4().hex[:8]}"
    yield value
    with Connection(rabbitmq_url) as connection:
        channel = connection.channel()
        for queue in QUEUES:
            channel.queue_delete(f"{value}_{queue}")
        for exchange in ("topic", "default", "qobj", "fn"):
            channel.exchange_delete(f"{value}_{exchange}")
        channel.close()


Landed = tuple[str, str, str, str]  # queue, task, exchange, routing key


def take(connection: Connection, queue: str, sender: str) -> list[Landed]:
    """Every message in `queue` (none if it does not exist) sent by `sender` ("celery" or
    "emq", told by the `emq_due_ms` header); AssertionError on one of the other."""
    channel = connection.channel()
    found: list[Landed] = []
    try:
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            headers = message.headers or {}
            assert ("emq_due_ms" in headers) == (sender == "emq"), (queue, headers)
            info = message.delivery_info
            found.append((queue, headers["task"], info["exchange"], info["routing_key"]))
    except NotFound:
        return []
    channel.close()
    return found


def exists(connection: Connection, queue: str) -> bool:
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except NotFound:
        return False
    channel.close()
    return True


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_beat_delivers_tasks_routed_by_the_app_where_celery_beat_delivers_them(
    rabbitmq_url: str, redis_url: str, prefix: str, names: str, tmp_path: Path
) -> None:
    (tmp_path / "s24routes.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "S24_BROKER": rabbitmq_url,
        "S24_REDIS": redis_url,
        "S24_PREFIX": prefix,
        "S24_NAMES": names,
    }
    queues = [f"{names}_{queue}" for queue in QUEUES]
    audit = queues[0]

    def run_beat(sender: str, *scheduler: str) -> tuple[set[Landed], str]:
        """Run a beat until the audit queue (bound to the topic exchange with `r.#`) holds
        each task; return where its messages landed and its log."""
        log = tmp_path / f"{sender}.log"
        seen: list[Landed] = []
        with Connection(rabbitmq_url) as connection, log.open("ab") as out:
            # The audit queue is bound to the routes' topic exchange as an auditing
            # consumer's would be; the reports queue as its worker declares it.
            topic = Exchange(f"{names}_topic", type="topic")
            for name in (audit, f"{names}_reports"):
                Queue(name, topic, "r.#")(connection.channel()).declare()
            command = ["celery", "-A", "s24routes", "beat", "--pidfile=", "-l", "info"]
            process = subprocess.Popen(
                [sys.executable, "-m", *command, *scheduler],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

            def audited() -> bool:
                seen.extend(take(connection, audit, sender))
                return {task for _, task, _, _ in seen} >= TASKS

            def then() -> Any:
                return sorted(set(seen)), log.read_text(errors="replace")[-3000:]

            try:
                wait_until(audited, 45, f"{sender}'s beat to send each task", then=then)
            finally:
                stop(process)
            for queue in queues:
                seen.extend(take(connection, queue, sender))
            assert not exists(connection, f"{names}_default")  # nothing routes there
        return set(seen), log.read_text(errors="replace")

    # Celery's own beat (the default scheduler, its state file in tmp_path) ...
    celery_beat, _ = run_beat("celery", f"--schedule={tmp_path / 'celerybeat-schedule'}")
    # ... then emq-bridge's, on the queues Celery's beat declared (the priority queue too).
    emq_beat, emq_log = run_beat("emq", "-S", "emq")

    assert "PRECONDITION_FAILED" not in emq_log
    assert "dispatch of occurrence" not in emq_log, emq_log[-3000:]
    assert emq_beat == celery_beat
    # Each through the topic exchange with its route's routing key, to every queue bound
    # there: the audit queue, the reports queue (`r.#`) and the route's own queue.
    topic = f"{names}_topic"
    keys = {"s24.report": "r.#", "s24.qobj": "r.qobj", "s24.exonly": "r.exonly", "s24.fn": "r.fn"}
    expected = {
        (f"{names}_{queue}", task, topic, key)
        for task, key in keys.items()
        for queue in ("audit", "reports")
    }
    expected |= {
        (f"{names}_qobj", "s24.qobj", topic, "r.qobj"),
        (f"{names}_fn", "s24.fn", topic, "r.fn"),
    }
    assert emq_beat == expected
