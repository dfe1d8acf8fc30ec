"""`RepeatScheduler`, `CeleryDispatcher`, `@recurring` and boot sync, in process.

Real servers: the registry and the Celery broker are the test Redis (embedded unless
REDIS_URL is set). Sent tasks are read back from the broker's own lists. Time moves with
an injected clock, so nothing here sleeps.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery
from celery.app.task import Context
from celery.beat import Service
from celery.schedules import BaseSchedule, crontab, schedstate

from emq_bridge import Repeat, occurrence_id
from emq_bridge.celery import (
    BeatRefused,
    CeleryDispatcher,
    PipelinedCeleryDispatcher,
    RepeatScheduler,
    app_schedule,
    load_target,
    nominal_due_ms,
    nominal_time,
    recurring,
    registry_url,
    sync_app,
)
from emq_bridge.errors import ConfigError, DispatchError, RegistryUnavailable
from emq_bridge.occurrence import Occurrence
from emq_bridge.testing import ManualClock

DEAD_URL = "redis://127.0.0.1:1/0"
PARIS = ZoneInfo("Europe/Paris")


def record(*args: Any, **kwargs: Any) -> None:
    return None


def other(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Any]:
    apps: list[Celery] = []

    def build(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
        app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            timezone="Europe/Paris",
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule=beat_schedule or {},
            result_backend=None,
            result_expires=None,  # no celery.backend_cleanup entry in these tests
        )
        app.conf.update(conf)
        app.task(name="t.record", shared=False)(record)
        app.task(name="t.other", shared=False)(other)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def command_count(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def reads(client: redis.Redis) -> int:
    """The server's socket reads: a pipeline arrives in one or a few, a command in one."""
    return int(client.info("stats")["total_reads_processed"])


def broker_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Every task message waiting in a Redis-broker queue (all priority lists), oldest first."""
    found = []
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        found += [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]
    return found


def start(scheduler: RepeatScheduler) -> ManualClock:
    """Drive `scheduler` with a manual clock that starts at the Redis server's now."""
    assert scheduler.pump is not None
    clock = ManualClock(scheduler.pump.repeat.server_time_ms())
    scheduler.pump.clock = clock
    return clock


def record_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:*", count=1000))


@pytest.mark.parametrize("pipelined", [False, True], ids=["apply_async", "pipelined"])
def test_each_occurrence_is_sent_as_a_real_task_whose_id_is_the_occurrence_id(
    make_app: Any, client: redis.Redis, prefix: str, pipelined: bool
) -> None:
    app = make_app(
        {"tick": {"task": "t.record", "schedule": 1.0, "args": [7], "kwargs": {"k": "v"}}},
        emq_bridge_pipelined=pipelined,
    )
    scheduler = RepeatScheduler(app)
    assert scheduler.pump is not None
    kind = PipelinedCeleryDispatcher if pipelined else CeleryDispatcher
    assert type(scheduler.pump.dispatcher) is kind
    clock = start(scheduler)
    registration = scheduler.pump.repeat.get(f"{prefix}-q", "tick")  # type: ignore[union-attr]
    assert registration is not None and registration.source == f"celery.app-{prefix}"
    first_due = registration.next_run_ms
    assert first_due is not None and first_due % 1000 == 0  # the next second of the grid
    clock.set(first_due - 1000)  # each tick below reaches the next slot exactly
    for _ in range(3):
        clock.advance(1000)
        scheduler.tick()
    messages = broker_messages(client, f"{prefix}-q")
    dues = [first_due, first_due + 1000, first_due + 2000]
    assert [m["headers"]["id"] for m in messages] == [
        occurrence_id(prefix, f"{prefix}-q", "tick", due) for due in dues
    ]
    headers = messages[0]["headers"]
    assert headers["task"] == "t.record"
    assert headers["celery_beat_task"] is True
    assert headers["emq_due_ms"] == first_due
    assert headers["emq_schedule"] == f"{prefix}-q/tick"
    assert headers["argsrepr"] == "[7]" and headers["kwargsrepr"] == "{'k': 'v'}"
    scheduler.close()


def test_entry_options_reach_the_sent_task(make_app: Any, client: redis.Redis, prefix: str) -> None:
    app = make_app(
        {
            "opts": {
                "task": "t.record",
                "schedule": 1.0,
                "options": {
                    "queue": f"{prefix}-other",
                    "priority": 3,
                    "expires": 30,
                    "headers": {"mine": "x"},
                },
            }
        }
    )
    scheduler = RepeatScheduler(app)
    start(scheduler).advance(1000)
    scheduler.tick()
    [message] = broker_messages(client, f"{prefix}-other")
    assert message["headers"]["mine"] == "x"
    assert message["headers"]["celery_beat_task"] is True
    assert message["headers"]["expires"] is not None
    assert message["properties"]["priority"] == 3
    assert broker_messages(client, f"{prefix}-q") == []
    scheduler.close()


def test_a_crontab_entry_fires_on_its_wall_clock_slot_in_the_app_time_zone(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    scheduler = RepeatScheduler(
        make_app({"nightly": {"task": "t.record", "schedule": crontab(minute=30, hour=2)}})
    )
    clock = start(scheduler)
    due = scheduler.pump.repeat.get(f"{prefix}-q", "nightly").next_run_ms  # type: ignore[union-attr]
    local = datetime.fromtimestamp(due / 1000, timezone.utc).astimezone(PARIS)
    assert (local.hour, local.minute) == (2, 30)
    clock.set(due)
    scheduler.tick()
    assert [m["headers"]["emq_due_ms"] for m in broker_messages(client, f"{prefix}-q")] == [due]
    scheduler.close()


def test_three_schedulers_on_one_registry_send_each_occurrence_once(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    beats = [
        RepeatScheduler(make_app({"tick": {"task": "t.record", "schedule": 1.0}})) for _ in range(3)
    ]
    clock = start(beats[0])
    for beat in beats[1:]:
        beat.pump.clock = clock  # type: ignore[union-attr]
    for step in range(6):
        clock.advance(1000)
        for beat in beats[step % 3 :] + beats[: step % 3]:
            beat.tick()
    ids = [m["headers"]["id"] for m in broker_messages(client, f"{prefix}-q")]
    assert len(ids) == 6
    assert len(set(ids)) == 6
    for beat in beats:
        beat.close()


def test_a_restarted_scheduler_keeps_the_countdown_and_sends_nothing_extra(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    entries = {"slow": {"task": "t.record", "schedule": timedelta(seconds=10)}}
    first = RepeatScheduler(make_app(entries))
    clock = start(first)
    first_due = first.pump.repeat.get(f"{prefix}-q", "slow").next_run_ms  # type: ignore[union-attr]
    clock.set(first_due)  # type: ignore[arg-type]
    first.tick()
    next_due = first.pump.repeat.get(f"{prefix}-q", "slow").next_run_ms  # type: ignore[union-attr]
    assert next_due == first_due + 10_000  # type: ignore[operator]
    first.close()
    clock.set(first_due + 4_000)  # type: ignore[operator]  # restart 4 s into the countdown
    second = RepeatScheduler(make_app(entries))
    second.pump.clock = clock  # type: ignore[union-attr]
    second.tick()
    assert second.pump.repeat.get(f"{prefix}-q", "slow").next_run_ms == next_due  # type: ignore[union-attr]
    assert len(broker_messages(client, f"{prefix}-q")) == 1
    clock.set(next_due)  # type: ignore[arg-type]
    second.tick()
    assert [m["headers"]["emq_due_ms"] for m in broker_messages(client, f"{prefix}-q")][
        1
    ] == next_due
    second.close()


def test_removed_entries_disappear_at_the_next_start_and_runtime_ones_are_kept(
    make_app: Any, prefix: str
) -> None:
    first = RepeatScheduler(
        make_app(
            {"a": {"task": "t.record", "schedule": 5}, "b": {"task": "t.record", "schedule": 5}}
        )
    )
    repeat = first.pump.repeat  # type: ignore[union-attr]
    repeat.register(f"{prefix}-q", "added-at-runtime", every="1h", template={"task": "t.other"})
    first.close()
    second = RepeatScheduler(make_app({"a": {"task": "t.record", "schedule": 5}}))
    assert sorted(repeat.names(f"{prefix}-q")) == ["a", "added-at-runtime"]
    second.close()


def test_a_registration_added_at_runtime_fires_without_a_restart(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    scheduler = RepeatScheduler(make_app())
    clock = start(scheduler)
    scheduler.tick()
    scheduler.pump.repeat.upsert(  # type: ignore[union-attr]
        f"{prefix}-q",
        "hot",
        every="1s",
        template={"task": "t.other", "args": [1]},
        now_ms=clock.now_ms,
    )
    clock.advance(1000)
    scheduler.tick()
    [message] = broker_messages(client, f"{prefix}-q")
    assert message["headers"]["task"] == "t.other"
    scheduler.close()


class EveryOtherSecond(BaseSchedule):
    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        base = last_run_at.replace(microsecond=0) + timedelta(seconds=1)
        return base + timedelta(seconds=base.second % 2) - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        return schedstate(remaining <= 0, max(remaining, 0))


def test_a_custom_schedule_class_is_computed_by_the_beat_process(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    scheduler = RepeatScheduler(
        make_app({"even": {"task": "t.record", "schedule": EveryOtherSecond()}})
    )
    clock = start(scheduler)
    # From the sync's instant, not the server's now at this line: on a loaded machine a
    # second may pass between the two, and a pump that checks late fires at its check's
    # instant, as Celery's beat does (its custom schedules have no slots of their own).
    registration = scheduler.pump.repeat.get(f"{prefix}-q", "even")  # type: ignore[union-attr]
    assert registration is not None and registration.created_ms is not None
    clock.set(registration.created_ms)
    for _ in range(8):
        clock.advance(1000)
        scheduler.tick()
    dues = [m["headers"]["emq_due_ms"] for m in broker_messages(client, f"{prefix}-q")]
    assert len(dues) >= 3
    assert all((due // 1000) % 2 == 0 and due % 1000 == 0 for due in dues), dues
    scheduler.close()


def test_the_lazy_instance_celery_builds_for_its_banner_touches_nothing(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    scheduler = RepeatScheduler(
        make_app({"a": {"task": "t.record", "schedule": 5}}, emq_bridge_redis_url=DEAD_URL),
        lazy=True,
    )
    assert scheduler.pump is None
    assert "127.0.0.1:1" in scheduler.info
    assert record_keys(client, prefix) == []


def test_the_emq_alias_and_beat_scheduler_setting_resolve_to_the_repeat_scheduler(
    make_app: Any,
) -> None:
    app = make_app()
    assert isinstance(Service(app, scheduler_cls="emq").get_scheduler(lazy=True), RepeatScheduler)
    app.conf.beat_scheduler = "emq_bridge.celery:RepeatScheduler"
    assert isinstance(
        Service(app, scheduler_cls=app.conf.beat_scheduler).get_scheduler(lazy=True),
        RepeatScheduler,
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"task": "t.nope", "schedule": 5}, "unknown task"),
        ({"task": "t.record", "schedule": "daily"}, "is not a schedule"),
        ({"task": "t.record", "schedule": 5, "optoins": {}}, "Celery rejects this entry"),
    ],
)
def test_bad_input_stops_the_scheduler_at_start_with_nothing_written(
    make_app: Any,
    client: redis.Redis,
    prefix: str,
    entry: dict[str, Any],
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app({"good": {"task": "t.record", "schedule": 5}, "bad": entry})
    with pytest.raises(BeatRefused) as refused, caplog.at_level(logging.ERROR, "emq_bridge"):
        RepeatScheduler(app)
    assert isinstance(refused.value.error, ConfigError) and message in str(refused.value)
    assert refused.value.code == 1  # a SystemExit: celery beat ends on the one line logged
    assert "refuses to start" in caplog.text
    assert record_keys(client, prefix) == []


def test_an_unreachable_registry_stops_the_scheduler_at_start(make_app: Any) -> None:
    with pytest.raises(BeatRefused) as refused:
        RepeatScheduler(
            make_app({"a": {"task": "t.record", "schedule": 5}}, emq_bridge_redis_url=DEAD_URL)
        )
    assert isinstance(refused.value.error, RegistryUnavailable)


def test_the_registry_defaults_to_a_redis_broker_and_is_required_otherwise(
    make_app: Any, redis_url: str
) -> None:
    assert registry_url(make_app()) == redis_url
    assert (
        registry_url(make_app(emq_bridge_redis_url="redis://elsewhere:6379/3"))
        == "redis://elsewhere:6379/3"
    )
    assert registry_url(make_app(broker_url="redis+socket:///tmp/r.sock")) == "unix:///tmp/r.sock"
    with pytest.raises(ConfigError, match="emq_bridge_redis_url"):
        registry_url(make_app(broker_url="amqp://guest@localhost//"))


def test_the_dispatcher_sends_unknown_task_names_by_name(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    occurrence = Occurrence(
        f"{prefix}-q",
        "n",
        1_900_000_000_000,
        str(uuid.uuid4()),
        {"task": "remote.task", "args": [1]},
        1_900_000_000_001,
    )
    CeleryDispatcher(make_app()).dispatch(occurrence)
    [message] = broker_messages(client, f"{prefix}-q")
    assert message["headers"]["task"] == "remote.task"
    assert message["headers"]["id"] == occurrence.id


def test_a_batch_on_the_default_path_runs_every_signal_and_reaches_redis_in_one_pipeline(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    from celery.signals import after_task_publish, before_task_publish

    queue = f"{prefix}-q"
    batch = [
        Occurrence(queue, f"n{i}", 1_900_000_000_000, str(uuid.uuid4()), {"task": "t.record"}, 0)
        for i in range(50)
    ]
    before: list[str] = []
    after: list[str] = []

    def on_before(headers: dict[str, Any], **_: Any) -> None:
        before.append(headers["id"])

    def on_after(headers: dict[str, Any], **_: Any) -> None:
        after.append(headers["id"])

    dispatcher = CeleryDispatcher(make_app())
    warm = Occurrence(f"{prefix}-warm", "w", 0, str(uuid.uuid4()), {"task": "t.record"}, 0)
    assert dispatcher.dispatch_batch([warm]) == [None]  # connections and declarations made
    before_task_publish.connect(on_before)
    after_task_publish.connect(on_after)
    try:
        pushes = command_count(client, "lpush")
        before_reads = reads(client)
        assert dispatcher.dispatch_batch(batch) == [None] * 50
        during = reads(client) - before_reads  # this INFO call is one of them
    finally:
        before_task_publish.disconnect(on_before)
        after_task_publish.disconnect(on_after)
    ids = [o.id for o in batch]
    assert before == after == ids
    assert [m["headers"]["id"] for m in broker_messages(client, queue)] == ids
    assert command_count(client, "lpush") - pushes == 50
    # kombu's publish batch: a few reads (the queue's declaration, the pipeline, which may
    # arrive in more than one, this INFO), not one or more per message.
    assert during < 15


def test_a_failed_batch_pipeline_reports_every_message_of_it_failed(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    from celery.signals import before_task_publish

    queue = f"{prefix}-q"
    batch = [
        Occurrence(queue, f"n{i}", 1_900_000_000_000, str(uuid.uuid4()), {"task": "t.record"}, 0)
        for i in range(2)
    ]

    def break_the_queue(headers: dict[str, Any], **_: Any) -> None:
        # After the first message is buffered, its list becomes a string: the batch's
        # pipeline fails when it is flushed, so neither message is known to be in.
        if headers["id"] == batch[1].id:
            client.delete(queue)
            client.set(queue, "not a list")

    before_task_publish.connect(break_the_queue)
    try:
        errors = CeleryDispatcher(make_app()).dispatch_batch(batch)
    finally:
        before_task_publish.disconnect(break_the_queue)
    assert all(isinstance(e, DispatchError) for e in errors), errors
    assert all("did not take the batch" in str(e) for e in errors)


def test_a_task_reads_its_nominal_time_from_the_request() -> None:
    request = Context({"id": "x", "emq_due_ms": 1_900_000_000_250})
    assert nominal_due_ms(request) == 1_900_000_000_250
    assert nominal_time(request) == datetime.fromtimestamp(1_900_000_000.25, timezone.utc)
    assert nominal_time(Context({"id": "y"})) is None


def test_recurring_declares_a_task_schedule_in_the_app_time_zone(
    make_app: Any, prefix: str
) -> None:
    app = make_app()

    @recurring(cron="0 9 * * 1-5")
    @app.task(name=f"t.{prefix}.digest", shared=False)
    def digest() -> None:
        return None

    @recurring(
        every="15m", name=f"poll-{prefix}", kwargs={"a": 1}, options={"queue": f"{prefix}-poll"}
    )
    @app.task(name=f"t.{prefix}.poll", shared=False)
    def poll(a: int) -> None:
        return None

    found = {d.name: d for d in app_schedule(app).declarations}
    cron = found[f"t.{prefix}.digest"]
    assert (cron.queue, cron.definition.cadence.describe()) == (
        f"{prefix}-q",
        "cron 0 9 * * 1-5 (Europe/Paris)",
    )
    every = found[f"poll-{prefix}"]
    assert every.queue == f"{prefix}-poll"
    assert every.definition.template["kwargs"] == {"a": 1}


def test_recurring_below_app_task_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"above @app\.task"):
        recurring(every="1m")(record)


def test_a_worker_start_syncs_its_decorated_schedules_and_never_the_beat_schedule(
    make_app: Any, prefix: str, client: redis.Redis
) -> None:
    from celery.signals import celeryd_after_setup

    app = make_app({"a": {"task": "t.record", "schedule": 5}})

    @recurring(every="1h")
    @app.task(name=f"t.{prefix}.hourly", shared=False)
    def hourly() -> None:
        return None

    worker = type("Worker", (), {"app": app})()
    celeryd_after_setup.send(sender="w@host", instance=worker, conf=app.conf)
    # `beat_schedule` belongs to the beat: a worker syncs only what its code decorates.
    assert Repeat(client, prefix).names(f"{prefix}-q") == [f"t.{prefix}.hourly"]


def test_a_failed_boot_sync_is_logged_as_an_error_not_swallowed(
    make_app: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from celery.signals import celeryd_after_setup

    app = make_app({"a": {"task": "t.record", "schedule": 5}}, emq_bridge_redis_url=DEAD_URL)

    @recurring(every="1h")
    @app.task(name=f"t.{prefix}.hourly", shared=False)
    def hourly() -> None:
        return None

    worker = type("Worker", (), {"app": app})()
    with caplog.at_level(logging.ERROR, "emq_bridge"):
        celeryd_after_setup.send(sender="w@host", instance=worker, conf=app.conf)
    assert "boot-time sync of the schedules FAILED" in caplog.text


def test_a_schedule_file_named_in_the_app_config_is_synced_under_its_own_source(
    make_app: Any, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        f'source = "file-{prefix}"\nqueue = "{prefix}-file"\n\n'
        '[[schedule]]\nname = "from-file"\ntask = "t.other"\nevery = "5m"\n'
    )
    app = make_app({"a": {"task": "t.record", "schedule": 5}}, emq_bridge_schedule_file=str(path))
    plans = sync_app(app)
    sources = [f"celery.app-{prefix}", f"celery.app-{prefix}.recurring", f"file-{prefix}"]
    assert [p.source for p in plans] == sources
    registration = Repeat(client, prefix).get(f"{prefix}-file", "from-file")
    assert registration is not None and registration.source == f"file-{prefix}"
    assert f"{prefix}-file" in app_schedule(app).queues


def test_load_target_finds_the_app_the_way_celery_a_does(
    tmp_path: Path, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / f"proj_{prefix}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "celery.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('proj', broker={redis_url!r})\n"
        f"app.conf.emq_bridge_prefix = {prefix!r}\n"
        "app.conf.result_expires = None\n"
        "app.conf.beat_schedule = {'tick': {'task': 'proj.tick', 'schedule': 30}}\n"
        "@app.task(name='proj.tick')\n"
        "def tick():\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        for spec in (f"proj_{prefix}", f"proj_{prefix}.celery:app"):
            target = load_target(spec)
            assert isinstance(target.dispatcher, CeleryDispatcher)
            assert [d.name for d in target.declarations] == ["tick"]
            assert target.source == "celery.proj"
            assert "celery" in target.queues
            assert target.resolve_cadence is not None
    finally:
        for name in [m for m in sys.modules if m.startswith(f"proj_{prefix}")]:
            del sys.modules[name]
    with pytest.raises(ConfigError, match="cannot load the Celery app"):
        load_target(f"nowhere_{prefix}")
    broken = tmp_path / f"broken_{prefix}.py"
    broken.write_text("raise RuntimeError('no config here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"RuntimeError: no config here \(-vv shows"):
        load_target(f"broken_{prefix}")


def test_the_example_app_declares_its_beat_schedule_and_decorated_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    from celery_app import app

    app.loader.import_default_modules()
    plan = app_schedule(app)
    assert {d.name for d in plan.declarations} == {
        "heartbeat",
        "tidy-up",
        "weekday-report",
        "celery.backend_cleanup",
        "celery_app.tasks.morning_digest",
        "celery_app.tasks.poll",
    }
    assert plan.source == "celery.celery_app"


def test_a_redis_outage_after_start_is_logged_once_and_retried_with_backoff(
    make_app: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = RepeatScheduler(make_app({"a": {"task": "t.record", "schedule": 5}}))
    assert scheduler.pump is not None
    healthy = scheduler.pump.repeat
    scheduler.pump.repeat = Repeat(redis.Redis.from_url(DEAD_URL), prefix)
    with caplog.at_level(logging.WARNING, "emq_bridge"):
        delays = [scheduler.tick(), scheduler.tick()]
        scheduler.pump.repeat = healthy
        scheduler.tick()
    assert 0 < delays[0] < delays[1] <= scheduler.max_interval
    assert [r.levelname for r in caplog.records if "unreachable" in r.getMessage()] == ["ERROR"]
    assert "reachable again" in caplog.text
    scheduler.close()


def test_a_broker_that_refuses_the_task_is_a_dispatch_error(make_app: Any, prefix: str) -> None:
    app = make_app(
        broker_url="amqp://guest:guest@127.0.0.1:1//",  # nothing listens on port 1
        task_publish_retry=False,
        broker_transport_options={"max_retries": 1, "interval_start": 0, "interval_step": 0},
    )
    occurrence = Occurrence(
        f"{prefix}-q", "n", 1_900_000_000_000, str(uuid.uuid4()), {"task": "t.record"}, 0
    )
    with pytest.raises(DispatchError, match=r"sending 't\.record' failed"):
        CeleryDispatcher(app).dispatch(occurrence)
