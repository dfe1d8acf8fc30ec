"""The Dramatiq integration with real workers (`dramatiq.Worker` in-process) on real brokers.

Each test builds its own app: a broker with a unique namespace (or unique RabbitMQ queues),
a unique registry prefix and queue, and actors that record each execution in a Redis list.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from itertools import pairwise
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage

from emq_bridge import ConfigError, DispatchError, Repeat, ScheduleError, occurrence_id
from emq_bridge.dramatiq import (
    BootError,
    DramatiqDispatcher,
    PipelinedDramatiqDispatcher,
    RecurringMiddleware,
    RecurringOptionError,
    broker_declarations,
    build_message,
    current_occurrence,
    every,
    occurrence_of,
    recurring,
    register,
)
from emq_bridge.errors import RegistryUnavailable
from emq_bridge.occurrence import Occurrence
from emq_bridge.testing import ManualClock, manual_pump


def wait_for(
    condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class App:
    """A Dramatiq app under test: its broker, middleware, queue, and where executions land."""

    broker: dramatiq.Broker
    middleware: RecurringMiddleware
    queue: str
    prefix: str
    client: redis.Redis
    seen_key: str
    actor: dramatiq.Actor[Any, Any]

    def seen(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.seen_key, 0, -1)]

    def run_worker(self) -> dramatiq.Worker:
        worker = dramatiq.Worker(self.broker, worker_threads=2, worker_timeout=100)
        worker.start()
        return worker


def build_app(
    broker: dramatiq.Broker,
    client: redis.Redis,
    prefix: str,
    queue: str,
    schedules: list[dict[str, Any]],
    **middleware_options: Any,
) -> App:
    """Declare one actor `tick` on `queue` carrying `schedules` (keyword sets for `recurring`)."""
    middleware = RecurringMiddleware(prefix=prefix, max_sleep_s=0.5, **middleware_options)
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(middleware)
    seen_key = f"{prefix}:seen"

    def tick(*args: Any, **kwargs: Any) -> None:
        message = CurrentMessage.get_current_message()
        info = current_occurrence()
        assert message is not None and info is not None
        client.rpush(
            seen_key,
            json.dumps(
                {
                    "message_id": message.message_id,
                    "id": info.id,
                    "name": info.name,
                    "queue": info.queue,
                    "due_ms": info.due_ms,
                    "args": list(args),
                    "kwargs": kwargs,
                }
            ),
        )

    actor: dramatiq.Actor[Any, Any] = dramatiq.actor(tick, broker=broker, queue_name=queue)
    for schedule in schedules:
        recurring(**schedule)(actor)
    return App(broker, middleware, queue, prefix, client, seen_key, actor)


@pytest.fixture
def names() -> tuple[str, str]:
    token = uuid.uuid4().hex[:10]
    return f"q{token}", f"dq{token}"


@pytest.fixture
def apps(client: redis.Redis) -> Iterator[list[tuple[dramatiq.Worker | None, App]]]:
    """Workers started by a test, stopped (and their brokers closed) at teardown."""
    started: list[tuple[dramatiq.Worker | None, App]] = []
    yield started
    for worker, app in started:
        if worker is not None:
            worker.stop(timeout=10_000)
        app.broker.close()


def start(apps: list[tuple[dramatiq.Worker | None, App]], app: App) -> dramatiq.Worker:
    worker = app.run_worker()
    apps.append((worker, app))
    return worker


def stop(apps: list[tuple[dramatiq.Worker | None, App]], worker: dramatiq.Worker) -> None:
    for index, (running, app) in enumerate(apps):
        if running is worker:
            worker.stop(timeout=10_000)
            apps[index] = (None, app)


def assert_consecutive_slots(seen: list[dict[str, Any]], every_ms: int) -> None:
    dues = sorted(s["due_ms"] for s in seen)
    assert len(set(dues)) == len(dues), f"an occurrence executed twice: {dues}"
    assert all(b - a == every_ms for a, b in pairwise(dues)), f"a slot was skipped: {dues}"


def assert_message_ids_are_occurrence_ids(app: App, seen: list[dict[str, Any]]) -> None:
    ids = [s["message_id"] for s in seen]
    assert len(set(ids)) == len(ids)
    for execution in seen:
        expected = occurrence_id(app.prefix, app.queue, execution["name"], execution["due_ms"])
        assert execution["message_id"] == expected == execution["id"]


# -- real workers on real brokers -----------------------------------------------------------


@pytest.mark.parametrize(
    "pipelined", [False, True, None], ids=["enqueue", "pipelined", "auto-is-pipelined"]
)
def test_a_redis_worker_runs_a_one_second_schedule_once_per_second_with_its_nominal_time(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    apps: list[Any],
    pipelined: bool | None,
) -> None:
    queue, namespace = names
    broker = RedisBroker(url=redis_url, namespace=namespace)
    app = build_app(
        broker,
        client,
        prefix,
        queue,
        [{"every": "1s", "args": [7], "kwargs": {"k": "v"}}],
        pipelined=pipelined,
    )
    start(apps, app)
    kind = DramatiqDispatcher if pipelined is False else PipelinedDramatiqDispatcher
    wait_for(lambda: app.middleware.pump is not None, 10, "the pump thread")
    assert type(app.middleware.pump.dispatcher) is kind  # type: ignore[union-attr]
    wait_for(lambda: len(app.seen()) >= 4, 30, "four executions")
    seen = app.seen()
    assert {s["name"] for s in seen} == {"tick"}
    assert all(s["args"] == [7] and s["kwargs"] == {"k": "v"} and s["queue"] == queue for s in seen)
    assert_consecutive_slots(seen, 1000)
    assert_message_ids_are_occurrence_ids(app, seen)
    registration = Repeat(client, prefix).get(queue, "tick")
    assert registration is not None and registration.source == "dramatiq"


def test_a_rabbitmq_worker_runs_a_one_second_schedule_once_per_second_with_its_nominal_time(
    rabbitmq_url: str,
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    apps: list[Any],
) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    queue, _ = names
    broker = RabbitmqBroker(url=rabbitmq_url, confirm_delivery=True)
    app = build_app(broker, client, prefix, queue, [{"every": "1s"}], repeat=redis_url)
    worker = start(apps, app)
    try:
        wait_for(lambda: app.middleware.pump is not None, 10, "the pump thread")
        # The automatic choice keeps one `broker.enqueue` per message off a RedisBroker.
        assert type(app.middleware.pump.dispatcher) is DramatiqDispatcher  # type: ignore[union-attr]
        wait_for(lambda: len(app.seen()) >= 4, 30, "four executions")
        seen = app.seen()
        assert_consecutive_slots(seen, 1000)
        assert_message_ids_are_occurrence_ids(app, seen)
    finally:
        stop(apps, worker)
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            broker.channel.queue_delete(name)


def test_restarting_the_worker_keeps_the_cadence(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    apps: list[Any],
) -> None:
    queue, namespace = names
    first = build_app(
        RedisBroker(url=redis_url, namespace=namespace), client, prefix, queue, [{"every": "2s"}]
    )
    worker = start(apps, first)
    wait_for(lambda: len(first.seen()) >= 1, 30, "a first execution")
    before = Repeat(client, prefix).get(queue, "tick")
    stop(apps, worker)
    last_due = max(s["due_ms"] for s in first.seen())

    second = build_app(
        RedisBroker(url=redis_url, namespace=namespace), client, prefix, queue, [{"every": "2s"}]
    )
    start(apps, second)
    assert [d.name for d in second.middleware.plans[0].unchanged] == ["tick"]
    wait_for(
        lambda: any(s["due_ms"] > last_due for s in second.seen()),
        30,
        "an execution after the restart",
    )
    after = Repeat(client, prefix).get(queue, "tick")
    assert before is not None and after is not None and after.created_ms == before.created_ms
    # Both workers record into one list. The first execution after the restart is the next
    # slot of the old cadence: no extra fire, no new countdown.
    assert min(s["due_ms"] for s in second.seen() if s["due_ms"] > last_due) == last_due + 2000
    assert_consecutive_slots(second.seen(), 2000)


def test_removing_a_decorator_prunes_its_schedule_but_a_runtime_registration_survives(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    apps: list[Any],
) -> None:
    queue, namespace = names
    both = [
        {"every": "1h", "name": "keep"},
        {"cron": "0 9 * * *", "tz": "Europe/Paris", "name": "drop"},
    ]
    first = build_app(
        RedisBroker(url=redis_url, namespace=namespace), client, prefix, queue, both, run_pump=False
    )
    worker = start(apps, first)
    repeat = Repeat(client, prefix)
    assert sorted(repeat.names(queue)) == ["drop", "keep"]
    assert register(repeat, first.actor, every="30m", name="runtime", args=[1]) == "registered"
    stop(apps, worker)

    second = build_app(
        RedisBroker(url=redis_url, namespace=namespace),
        client,
        prefix,
        queue,
        both[:1],
        run_pump=False,
    )
    start(apps, second)
    assert sorted(repeat.names(queue)) == ["keep", "runtime"]
    assert second.middleware.plans[0].remove == [(queue, "drop")]


def test_two_schedules_on_one_actor_and_the_actor_option_form_are_all_declared(
    prefix: str,
) -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(prefix=prefix))

    @recurring(every="1m", name="eu", args=["eu"])
    @recurring(every="5m", name="us", args=["us"])
    @dramatiq.actor(broker=broker, queue_name="reports")
    def rollup(region: str) -> None: ...

    @dramatiq.actor(
        broker=broker,
        queue_name="reports",
        recurring=[every("1h"), {"cron": "@daily", "name": "daily"}],
    )
    def digest() -> None: ...

    declared = {(d.queue, d.name): d.definition for d in broker_declarations(broker)}
    assert sorted(declared) == [
        ("reports", "daily"),
        ("reports", "digest"),
        ("reports", "eu"),
        ("reports", "us"),
    ]
    assert declared[("reports", "eu")].template == {
        "task": "rollup",
        "args": ["eu"],
        "kwargs": {},
        "options": {},
    }
    assert declared[("reports", "daily")].cadence.describe() == "cron @daily (UTC)"


def test_the_dispatcher_enqueues_a_message_whose_id_and_options_identify_the_occurrence() -> None:
    broker = StubBroker()
    dramatiq.actor(lambda *a, **k: None, broker=broker, actor_name="work", queue_name="jobs")
    template = {"task": "work", "args": [1], "kwargs": {"x": 2}, "options": {"max_retries": 0}}
    occurrence = Occurrence(
        "registry-q", "nightly", 1_800_000_000_000, "occ-id", template, 1_800_000_000_005
    )
    DramatiqDispatcher(broker).dispatch(occurrence)
    message = dramatiq.Message.decode(broker.queues["jobs"].get_nowait())
    assert (message.message_id, message.actor_name, message.queue_name) == (
        "occ-id",
        "work",
        "jobs",
    )
    assert (
        message.args == (1,) and message.kwargs == {"x": 2} and message.options["max_retries"] == 0
    )
    info = occurrence_of(message)
    assert info is not None
    assert (info.id, info.name, info.queue, info.due_ms) == (
        "occ-id",
        "nightly",
        "registry-q",
        1_800_000_000_000,
    )
    assert info.due.isoformat() == "2027-01-15T08:00:00+00:00"


# -- bad input ------------------------------------------------------------------------------


def test_an_unknown_actor_is_an_error_when_registering_and_when_dispatching(
    client: redis.Redis, prefix: str
) -> None:
    broker = StubBroker()
    with pytest.raises(ConfigError, match="'nope' is not declared"):
        register(Repeat(client, prefix), "nope", every="1m", broker=broker)
    occurrence = Occurrence("q", "n", 0, "id", {"task": "nope"}, 0)
    with pytest.raises(DispatchError, match="actor 'nope' is not declared on this broker"):
        build_message(broker, occurrence)


def test_an_invalid_cadence_is_an_error_where_it_is_declared() -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware())
    actor = dramatiq.actor(lambda: None, broker=broker, actor_name="a")
    with pytest.raises(ScheduleError, match="not an interval"):
        recurring(every="soon")
    with pytest.raises(ScheduleError, match="invalid cron"):
        recurring(cron="61 * * * *")
    with pytest.raises(ScheduleError, match="exactly one cadence"):
        recurring(every="1m", cron="* * * * *")
    with pytest.raises(RecurringOptionError, match="not an interval"):
        dramatiq.actor(lambda: None, broker=broker, actor_name="b", recurring={"every": "soon"})
    recurring(every="1m")(actor)
    with pytest.raises(ScheduleError, match="distinct name="):
        recurring(every="2m")(actor)
    with pytest.raises(ScheduleError, match="above @dramatiq\\.actor"):
        recurring(every="1m")(lambda: None)


def test_a_worker_does_not_boot_when_its_registry_is_unreachable(names: tuple[str, str]) -> None:
    _, namespace = names
    broker = RedisBroker(url="redis://127.0.0.1:1/0", namespace=namespace)
    broker.add_middleware(RecurringMiddleware())
    recurring(every="1s")(
        dramatiq.actor(lambda: None, broker=broker, actor_name="a", queue_name="q")
    )
    worker = dramatiq.Worker(broker, worker_threads=1)
    with pytest.raises(BootError, match="Redis is unreachable") as caught:
        worker.start()
    assert isinstance(caught.value.__cause__, RegistryUnavailable)
    assert not worker.workers


def test_a_schedule_file_is_synced_at_boot_under_its_own_source(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    apps: list[Any],
    tmp_path: Any,
) -> None:
    queue, namespace = names
    schedule_file = tmp_path / "schedules.toml"
    schedule_file.write_text(
        f'source = "ops-file"\nqueue = "{queue}"\n\n'
        '[[schedule]]\nname = "from-file"\ntask = "tick"\nevery = "1h"\nargs = [3]\n'
    )
    app = build_app(
        RedisBroker(url=redis_url, namespace=namespace),
        client,
        prefix,
        queue,
        [{"every": "1h"}],
        run_pump=False,
        schedule_file=schedule_file,
    )
    start(apps, app)
    registrations = {r.name: r for r in Repeat(client, prefix).list(queue)}
    assert {name: r.source for name, r in registrations.items()} == {
        "tick": "dramatiq",
        "from-file": "ops-file",
    }
    assert registrations["from-file"].definition.template["args"] == [3]


def test_a_worker_does_not_boot_when_its_schedule_file_names_an_unknown_actor(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    tmp_path: Any,
) -> None:
    queue, namespace = names
    schedule_file = tmp_path / "schedules.toml"
    schedule_file.write_text(
        f'[[schedule]]\nqueue = "{queue}"\nname = "x"\ntask = "no_such_actor"\nevery = "1h"\n'
    )
    broker = RedisBroker(url=redis_url, namespace=namespace)
    build_app(broker, client, prefix, queue, [], run_pump=False, schedule_file=schedule_file)
    worker = dramatiq.Worker(broker, worker_threads=1)
    with pytest.raises(BootError, match="names actor 'no_such_actor', which is not declared"):
        worker.start()
    assert Repeat(client, prefix).names(queue) == []
    broker.close()


def test_a_worker_does_not_boot_when_its_schedule_file_was_emptied(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    names: tuple[str, str],
    tmp_path: Any,
) -> None:
    # Session 27: a schedule file emptied (or cut short) by a deploy removed every schedule
    # of its source at the next worker boot; it is refused, nothing removed.
    queue, namespace = names
    schedule_file = tmp_path / "schedules.toml"
    schedule_file.write_text(
        f'[[schedule]]\nqueue = "{queue}"\nname = "x"\ntask = "tick"\nevery = "1h"\n'
    )
    Repeat(client, prefix).upsert(
        queue, "x", every="1h", template={"task": "tick"}, source="file:schedules.toml"
    )
    schedule_file.write_text("")
    broker = RedisBroker(url=redis_url, namespace=namespace)
    build_app(broker, client, prefix, queue, [], run_pump=False, schedule_file=schedule_file)
    worker = dramatiq.Worker(broker, worker_threads=1)
    with pytest.raises(BootError, match="the schedule file declares no schedule"):
        worker.start()
    assert Repeat(client, prefix).names(queue) == ["x"]
    broker.close()


def test_a_stub_broker_test_sees_exactly_what_a_manual_clock_makes_due(repeat: Repeat) -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False))
    runs: list[tuple[str, int]] = []

    @dramatiq.actor(broker=broker, queue_name="reports")
    def digest(audience: str) -> None:
        info = current_occurrence()
        assert info is not None
        runs.append((audience, info.due_ms))

    clock = ManualClock(1_900_000_000_000)
    register(repeat, digest, every="15m", anchor="schedule", args=["staff"], now_ms=clock())
    pump = manual_pump(repeat, ["reports"], clock, DramatiqDispatcher(broker))
    assert pump.run_once().dispatched == []
    clock.advance(timedelta(minutes=30))
    assert len(pump.run_once().dispatched) == 1  # the two missed slots coalesce: the newest
    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()
    try:
        broker.join("reports", fail_fast=True)
    finally:
        worker.stop()
    assert runs == [("staff", 1_900_000_000_000 + 30 * 60_000)]


def test_a_worker_does_not_boot_with_an_invalid_registry_url_or_no_registry_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    for middleware, error in (
        (RecurringMiddleware("nota://url"), "invalid Redis URL"),  # no URL: it may hold a password
        (RecurringMiddleware(), "needs a registry: pass repeat="),
    ):
        broker = StubBroker()
        broker.add_middleware(middleware)
        with pytest.raises(BootError, match=error):
            dramatiq.Worker(broker, worker_threads=1).start()
