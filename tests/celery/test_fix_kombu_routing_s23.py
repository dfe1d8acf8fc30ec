"""A kombu `Queue` (`options["queue"]`) or `Exchange` (`options["exchange"]`) in a
`beat_schedule` entry routes its tasks as Celery's own beat routes them.

Celery's beat passes the objects to `apply_async` as they are; the stored template (JSON)
kept only their names, so the task went where the name alone routes it: a Queue's exchange,
routing key, bindings and arguments were lost. On RabbitMQ a Queue on a topic exchange named
like it failed every send (`PRECONDITION_FAILED - inequivalent arg 'type'`: the name declares
a direct exchange), so did a priority queue (`inequivalent arg 'x-max-priority'`), and a
Queue bound to a shared topic exchange reached its own queue only, through the default
exchange, never the other queues bound there. The template now holds each object's JSON
description, rebuilt at send time; what cannot be described is refused at conversion.
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
import redis
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from kombu import Connection, Exchange, Queue, binding
from kombu.common import Broadcast
from processes import stop, wait_until
from publish_spy import published

from emq_bridge import ConfigError
from emq_bridge.celery.dispatch import CeleryDispatcher, routing_option_error
from emq_bridge.celery.entries import convert_entry
from emq_bridge.occurrence import Occurrence
from emq_bridge.template import freeze


def make_app() -> Celery:
    app = Celery("kombu-routing", broker="memory://", set_as_current=False)
    app.conf.update(timezone="UTC", result_backend=None, result_expires=None)
    app.task(name="t.record", shared=False)(record)
    return app


def record(*args: Any) -> None:
    return None


EVENTS = Exchange("events", type="topic")
CASES: dict[str, dict[str, Any]] = {
    "direct queue, its own routing key": {
        "queue": Queue("reports", Exchange("reports", type="direct"), routing_key="reports.daily")
    },
    "topic exchange named as its queue": {
        "queue": Queue("tq", Exchange("tq", type="topic"), routing_key="tq.#")
    },
    "queue with arguments": {
        "queue": Queue("prio", Exchange("prio"), "prio", queue_arguments={"x-max-priority": 10})
    },
    "queue on a shared topic exchange": {"queue": Queue("ev", EVENTS, routing_key="ev.daily")},
    "queue with bindings": {
        "queue": Queue("multi", [binding(EVENTS, "multi.#"), binding(Exchange("b"), "b")])
    },
    "fanout queue": {"queue": Queue("fq", Exchange("fx", type="fanout"), max_priority=5)},
    "bare queue": {"queue": Queue("bare")},
    "exchange object": {"exchange": Exchange("events", type="topic"), "routing_key": "ev.x"},
    "default exchange object": {"exchange": Exchange(""), "routing_key": "elsewhere"},
    "transient exchange": {
        "exchange": Exchange("tx", type="topic", delivery_mode="transient"),
        "routing_key": "tx.a",
        "queue": "plain",
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_dispatcher_publishes_what_celery_beat_publishes_for_kombu_objects(case: str) -> None:
    app = make_app()
    options = CASES[case]
    raw = {"task": "t.record", "schedule": 5.0, "args": [1], "options": options}
    entry = ScheduleEntry(name=case, app=app, **raw)
    celery_beat = published(lambda: Scheduler(app, lazy=True).apply_async(entry))

    declaration, _ = convert_entry(app, case, raw)
    stored = json.loads(json.dumps(dict(declaration.definition.template)))  # what Redis holds
    occurrence = Occurrence(
        queue=declaration.queue,
        name=declaration.name,
        due_ms=0,
        id=str(uuid.uuid4()),
        template=freeze(stored),
        released_ms=0,
    )
    emq = published(lambda: CeleryDispatcher(app).dispatch(occurrence))

    assert len(celery_beat) == 1
    assert emq == celery_beat
    queue = options.get("queue")
    expected = queue.name if isinstance(queue, Queue) else (queue or "celery")
    assert declaration.queue == expected


def test_a_description_rebuilds_an_equal_object() -> None:
    from emq_bridge.celery.kombu_entities import entity_from_json, entity_json

    queue = Queue(
        "q",
        Exchange("x", type="topic", arguments={"alternate-exchange": "ae"}, durable=False),
        routing_key="q.#",
        queue_arguments={"x-queue-type": "quorum"},
        binding_arguments={"b": 1},
        expires=30,
        max_length=10,
        auto_delete=True,
    )
    rebuilt = entity_from_json(Queue, json.loads(json.dumps(entity_json(queue))))
    assert rebuilt == queue
    assert rebuilt.as_dict(recurse=True) == queue.as_dict(recurse=True)
    bound = Queue("m", [binding(EVENTS, "a.#", arguments={"k": "v"}), binding(Exchange("b"), "b")])
    described = entity_json(bound)
    assert described == entity_json(Queue("m", list(reversed(list(bound.bindings)))))  # stable
    again = entity_from_json(Queue, described)
    assert {entity_json(b)["routing_key"] for b in again.bindings} == {"a.#", "b"}
    assert again.exchange is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"queue": Broadcast("bcast")},
            "options['queue']: a Broadcast (a subclass of kombu's Queue) cannot be stored",
        ),
        (
            {"queue": Queue("q", on_declared=print)},
            "options['queue']: the on_declared callback of Queue 'q' cannot be stored",
        ),
        ({"queue": Queue("", Exchange("x"))}, "a Queue without a name cannot be stored"),
        (
            {"queue": Queue("q", Exchange("x"), "q", queue_arguments={"x-b": b"raw"})},
            "options['queue']: the queue_arguments of <unbound Queue q",
        ),
        ({"queue": Queue("q", queue_arguments={1: 2})}, "has a key 1 that is not a string"),
        ({"queue": Exchange("x")}, "options['queue'] is a kombu Exchange; Celery takes a kombu"),
        ({"exchange": Queue("q")}, "options['exchange'] is a kombu Queue"),
        ({"routing_key": Queue("q")}, "options['routing_key'] is a kombu Queue"),
    ],
)
def test_what_a_template_cannot_hold_is_refused_at_conversion_naming_the_entry(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        convert_entry(
            make_app(), "nightly", {"task": "t.record", "schedule": 5, "options": options}
        )
    text = str(caught.value)
    assert text.startswith("beat_schedule['nightly']: ")
    assert message in text
    assert "\n" not in text


def test_a_hand_written_description_is_checked_before_it_is_stored() -> None:
    from emq_bridge.celery.kombu_entities import entity_json

    good = entity_json(Queue("q", Exchange("x", type="topic"), "q.#"))
    assert routing_option_error({"queue": good}) is None
    assert routing_option_error({"exchange": entity_json(Exchange("x"))}) is None
    assert routing_option_error({"queue": {**good, "colour": 1}}) == (
        "options['queue']: a kombu Queue has no attribute 'colour'"
    )
    assert routing_option_error({"queue": {"name": "q"}}) == (
        "options['queue'] must be a name (a string), got {'name': 'q'}"
    )
    error = routing_option_error({"exchange": good})
    assert error is not None
    assert "is not the description of a kombu Exchange" in error
    assert routing_option_error({"routing_key": good}) is not None


# ---------------------------------------------------------------------------------------
# A real `celery beat -S emq` and real workers on RabbitMQ.

APP = textwrap.dedent("""
    import json, os
    import redis
    from celery import Celery
    from kombu import Exchange, Queue

    env = os.environ
    p = env["S23_NAMES"]
    app = Celery("s23kombu", broker=env["S23_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["S23_REDIS"],
        emq_bridge_prefix=env["S23_PREFIX"],
        task_default_queue=f"{p}-default",
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True},
    )
    events = Exchange(f"{p}-events", type="topic")
    QUEUES = {
        "topic": Queue(f"{p}-tq", Exchange(f"{p}-tq", type="topic"), routing_key="tq.#"),
        "prio": Queue(f"{p}-prio", Exchange(f"{p}-prio"), routing_key=f"{p}-prio",
                      queue_arguments={"x-max-priority": 10}),
        "events": Queue(f"{p}-ev", events, routing_key="ev.daily"),
    }
    AUDIT = Queue(f"{p}-audit", events, routing_key="ev.#")
    app.conf.beat_schedule = {
        label: {"task": "s23.record", "schedule": 1.0, "args": [label],
                "options": {"queue": queue}}
        for label, queue in QUEUES.items()
    }
    if env.get("S23_WORKER"):  # the workers declare the queues they consume as they are
        app.conf.task_queues = [*QUEUES.values(), AUDIT]
    results = redis.Redis.from_url(env["S23_REDIS"])

    @app.task(bind=True, name="s23.record")
    def record(self, label):
        info = self.request.delivery_info or {}
        results.rpush(env["S23_RESULTS"], json.dumps({
            "label": label, "worker": self.request.hostname.split("@")[0],
            "exchange": info.get("exchange"), "routing_key": info.get("routing_key"),
            "emq": self.request.emq_due_ms is not None}))
""")


@pytest.fixture
def names(rabbitmq_url: str) -> Iterator[str]:
    """A unique prefix of queue and exchange names; what the test declared is deleted."""
    value = f"s23probe-{uuid.uuid4().hex[:8]}"
    yield value
    with Connection(rabbitmq_url) as connection:
        channel = connection.channel()
        for queue in ("tq", "prio", "ev", "audit", "default"):
            channel.queue_delete(f"{value}-{queue}")
        for exchange in ("tq", "prio", "events", "ev", "default"):
            channel.exchange_delete(f"{value}-{exchange}")
        channel.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_beat_sends_kombu_queue_options_where_celery_beat_sends_them_on_rabbitmq(
    rabbitmq_url: str, redis_url: str, prefix: str, names: str, tmp_path: Path
) -> None:
    (tmp_path / "s23kombu.py").write_text(APP)
    results_key = f"{prefix}:results"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "S23_BROKER": rabbitmq_url,
        "S23_REDIS": redis_url,
        "S23_PREFIX": prefix,
        "S23_NAMES": names,
        "S23_RESULTS": results_key,
    }
    logs = {name: tmp_path / f"{name}.log" for name in ("main", "audit", "beat")}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str, **extra: str) -> None:
        with logs[name].open("ab") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "s23kombu", *args, "-l", "info"],
                    cwd=tmp_path,
                    env={**env, **extra},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    def worker(name: str, queues: str) -> None:
        start(
            name,
            "worker",
            "-P",
            "solo",
            "-n",
            f"{name}@%h",
            "-Q",
            queues,
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            S23_WORKER="1",
        )

    client = redis.Redis.from_url(redis_url)

    def results() -> list[dict[str, Any]]:
        return [json.loads(r) for r in client.lrange(results_key, 0, -1)]

    def seen() -> set[tuple[str, str]]:
        return {(r["worker"], r["label"]) for r in results()}

    wanted = {("main", "topic"), ("main", "prio"), ("main", "events"), ("audit", "events")}
    try:
        worker("main", f"{names}-tq,{names}-prio,{names}-ev")
        worker("audit", f"{names}-audit")
        wait_until(
            lambda: all("ready" in logs[n].read_text(errors="replace") for n in ("main", "audit")),
            60,
            "the workers to start",
        )
        start("beat", "beat", "-S", "emq", "--pidfile=", f"--schedule={tmp_path / 'beat.db'}")
        wait_until(
            lambda: wanted <= seen(),
            60,
            f"tasks at {sorted(wanted)}",
            then=lambda: (sorted(seen()), logs["beat"].read_text(errors="replace")[-3000:]),
        )
    finally:
        for proc in procs:
            stop(proc)
        client.close()

    beat_log = logs["beat"].read_text(errors="replace")
    assert "PRECONDITION_FAILED" not in beat_log
    assert "dispatch of occurrence" not in beat_log, beat_log[-3000:]
    found = results()
    assert all(r["emq"] for r in found)
    # Routed as Celery's beat routes the objects (its `send_task_message`): a direct
    # exchange goes to the queue through the default exchange; another type through the
    # queue's exchange, with its routing key, to every queue bound there.
    routes = {(r["worker"], r["label"]): (r["exchange"], r["routing_key"]) for r in found}
    assert routes[("main", "topic")] == (f"{names}-tq", "tq.#")
    assert routes[("main", "prio")] == ("", f"{names}-prio")
    assert routes[("main", "events")] == (f"{names}-events", "ev.daily")
    assert routes[("audit", "events")] == (f"{names}-events", "ev.daily")
    assert {r["label"] for r in found if r["worker"] == "audit"} == {"events"}
