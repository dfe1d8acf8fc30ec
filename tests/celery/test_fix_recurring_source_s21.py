"""The `@recurring` tasks' own source (`celery.<main>.recurring`) in a rolling deploy.

A worker prunes the schedules of the tasks it knows, as the beat does: a task only the
workers import whose queue changes moves (it was sent twice, from both queues, once the beat
kept both). An app's generation covers both of its sources: workers upgraded before the beat
raise the app's `beat_schedule` source too, so an older worker or beat can no longer take
the decorated schedules back under it with their older cadence (and a newer beat would then
prune one only the workers import). A schedule the beat keeps in a queue it does not pump
is said, and `emq-bridge pump --celery` counts what it kept.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from processes import stop, wait_until

from emq_bridge import Repeat
from emq_bridge.celery import recurring, sync_app
from emq_bridge.celery.declare import _DECLARED, decorated_schedule
from emq_bridge.definition import Schedule
from emq_bridge.sync import sync


def record(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Callable[..., Celery]]:
    apps: list[Celery] = []

    def build(generation: int | None = None, **conf: Any) -> Celery:
        app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            timezone="UTC",
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            emq_bridge_generation=generation,
            beat_schedule={"tick": {"task": "t.record", "schedule": 5}},
            result_backend=None,
            result_expires=None,
            **conf,
        )
        app.task(name="t.record", shared=False)(record)
        app.task(name="t.hourly", shared=False)(record)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def test_a_worker_upgraded_before_the_beat_keeps_older_processes_from_reverting_its_tasks(
    make_app: Callable[..., Celery],
    prefix: str,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    repeat, queue, source = Repeat(client, prefix), f"{prefix}-q", f"celery.app-{prefix}"
    old = make_app(generation=1)
    older_tasks = [Schedule(every="1h").bind("t.hourly", queue)]
    # What the version before the tasks' own source synced: everything under the app's.
    sync(repeat, [*sync_app_entries(old), *older_tasks], source, generation=1)
    new_worker = make_app(generation=2)
    mark = len(_DECLARED)
    recurring(every="2h")(new_worker.tasks["t.hourly"])
    try:
        sync_app(new_worker, beat=False)
        hourly = repeat.get(queue, "t.hourly")
        assert hourly is not None and hourly.source == f"{source}.recurring"
        live = (hourly.definition.cadence.describe(), hourly.updated_ms)
        assert live[0] == "every 2h"
        # An older worker's boot, then an older beat's, as the version before synced them.
        with caplog.at_level(logging.WARNING, logger="emq_bridge"):
            worker = sync(repeat, older_tasks, source, prune=False, generation=1)
            beat = sync(repeat, [*sync_app_entries(old), *older_tasks], source, generation=1)
        assert worker.refused_by == beat.refused_by == 2
        assert worker.changes == beat.changes == 0
        assert f"generation 1 refused, a newer generation (2) of {source}.recurring" not in (
            caplog.text
        )
        assert "generation 1 refused, a newer generation (2) of this source" in caplog.text
        after = repeat.get(queue, "t.hourly")
        assert after is not None and after.source == f"{source}.recurring"
        assert (after.definition.cadence.describe(), after.updated_ms) == live
        # The newer beat then syncs both sources at its generation.
        new_beat = make_app(generation=2)
        recurring(every="2h")(new_beat.tasks["t.hourly"])
        entries, tasks = sync_app(new_beat)
        assert entries.refused_by is None and tasks.refused_by is None
        assert [d.name for d in tasks.unchanged] == ["t.hourly"]
    finally:
        del _DECLARED[mark:]


def sync_app_entries(app: Celery) -> list[Any]:
    """The app's `beat_schedule` declarations, as its beat converts them."""
    from emq_bridge.celery import app_schedule

    return list(app_schedule(app).entries)


def test_an_older_generation_of_the_apps_source_refuses_the_tasks_sync_before_any_write(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis
) -> None:
    # The reverse: a newer deploy synced the app's source only; an older worker writes nothing.
    repeat, queue, source = Repeat(client, prefix), f"{prefix}-q", f"celery.app-{prefix}"
    sync(repeat, sync_app_entries(make_app(generation=5)), source, generation=5)
    worker = make_app(generation=4)
    mark = len(_DECLARED)
    recurring(every="1h")(worker.tasks["t.hourly"])
    try:
        [plan] = sync_app(worker, beat=False)
    finally:
        del _DECLARED[mark:]
    assert plan.refused_by == 5 and plan.changes == 0
    assert repeat.get(queue, "t.hourly") is None


def test_a_beat_says_when_it_keeps_a_schedule_in_a_queue_it_does_not_pump(
    make_app: Callable[..., Celery],
    prefix: str,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = make_app()
    worker.task(name="t.workers_only", shared=False)(record)
    options = {"queue": f"{prefix}-reports"}
    mark = len(_DECLARED)
    recurring(every="1h", options=options)(worker.tasks["t.workers_only"])
    try:
        sync_app(worker, beat=False)
        assert decorated_schedule(worker).tasks[0].queue == f"{prefix}-reports"
        with caplog.at_level(logging.INFO, logger="emq_bridge"):
            _, tasks = sync_app(make_app())
        assert tasks.kept == [(f"{prefix}-reports", "t.workers_only", "t.workers_only")]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            f"kept schedules in queue(s) {prefix}-reports, which this beat does not pump" in w
            and "emq_bridge_queues" in w
            for w in warnings
        ), warnings
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="emq_bridge"):
            sync_app(make_app(emq_bridge_queues=[f"{prefix}-reports"]))
        assert "does not pump" not in caplog.text
    finally:
        del _DECLARED[mark:]


APP_MODULE = textwrap.dedent("""
    import os

    import emq_bridge.celery  # for its reports, as docs/celery.md has workers do
    from celery import Celery

    app = Celery("{name}", broker=os.environ["APP_REDIS"])
    app.conf.update(
        emq_bridge_prefix=os.environ["APP_PREFIX"],
        task_default_queue=os.environ["APP_QUEUE"],
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
    )


    @app.task(name="{task}")  # no @recurring: the module declares none
    def job():
        return None
""")


def app_module(
    tmp_path: Path, name: str, task: str, redis_url: str, prefix: str, queue: str
) -> dict[str, str]:
    """Write module `name`, an app of one task and no `@recurring`, in `tmp_path`; return
    the environment a process of it runs with (the module importable, the app's settings)."""
    (tmp_path / f"{name}.py").write_text(APP_MODULE.format(name=name, task=task))
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "APP_REDIS": redis_url,
        "APP_PREFIX": prefix,
        "APP_QUEUE": queue,
    }


def test_pump_celery_counts_the_schedules_it_kept(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"{prefix}-q"
    env = app_module(tmp_path, "keptapp", "keptapp.record", redis_url, prefix, queue)
    # A worker that imports another module declared this one; the command's app has no such task.
    declared = Schedule(every="1h").bind("keptapp.workers_only", queue)
    sync(Repeat(client, prefix), [declared], "celery.keptapp.recurring", prune=False)
    done = subprocess.run(
        [sys.executable, "-m", "emq_bridge", "pump", "--celery", "keptapp", "--once"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "synced celery.keptapp.recurring: 0 created, 0 updated, 0 removed, 0 unchanged, "
        "1 kept (tasks this process does not know)"
    ) in done.stderr, done.stderr
    assert Repeat(client, prefix).get(queue, "keptapp.workers_only") is not None


def test_a_worker_moves_the_schedule_of_a_task_only_it_imports_when_its_queue_changes(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis
) -> None:
    repeat, source = Repeat(client, prefix), f"celery.app-{prefix}.recurring"
    before, after = make_app(), make_app()
    mark = len(_DECLARED)
    for app, queue in ((before, f"{prefix}-q"), (after, f"{prefix}-reports")):
        app.task(name="t.workers_only", shared=False)(record)
        recurring(every="1h", options={"queue": queue})(app.tasks["t.workers_only"])
    try:
        sync_app(before, beat=False)
        [moved] = sync_app(after, beat=False)
        assert [(d.queue, d.name) for d in moved.create] == [
            (f"{prefix}-reports", "t.workers_only")
        ]
        assert moved.remove == [(f"{prefix}-q", "t.workers_only")]
        # The beat, which does not import the task, keeps the one schedule there is.
        _, tasks = sync_app(make_app(emq_bridge_queues=[f"{prefix}-reports"]))
        assert tasks.kept == [(f"{prefix}-reports", "t.workers_only", "t.workers_only")]
        found = {(r.queue, r.name) for q in repeat.queues() for r in repeat.list(q)}
        assert (f"{prefix}-q", "t.workers_only") not in found
        owner = repeat.get(f"{prefix}-reports", "t.workers_only")
        assert owner is not None and owner.source == source
    finally:
        del _DECLARED[mark:]


def synced_with_then_without_decorator(make_app: Callable[..., Celery]) -> Celery:
    """A worker's sync of an app whose task `t.workers_only` is `@recurring`; return the same
    app's next deploy, the task without its decorator (not synced yet)."""
    decorated, plain = make_app(), make_app()
    for app in (decorated, plain):
        app.task(name="t.workers_only", shared=False)(record)
    mark = len(_DECLARED)
    recurring(every="1h")(decorated.tasks["t.workers_only"])
    try:
        sync_app(decorated, beat=False)
    finally:
        del _DECLARED[mark:]
    return plain


def test_a_worker_removes_the_schedule_of_a_task_it_imports_once_its_decorator_is_gone(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis
) -> None:
    plain = synced_with_then_without_decorator(make_app)
    [plan] = sync_app(plain, beat=False)  # the next deploy: the decorator removed
    assert plan.remove == [(f"{prefix}-q", "t.workers_only")]
    assert Repeat(client, prefix).get(f"{prefix}-q", "t.workers_only") is None


def test_a_worker_whose_code_declares_no_recurring_task_any_more_still_prunes_at_start(
    make_app: Callable[..., Celery],
    prefix: str,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The last decorator removed: the worker's start (celeryd_after_setup) still syncs.
    from types import SimpleNamespace

    from celery.signals import celeryd_after_setup

    plain = synced_with_then_without_decorator(make_app)
    assert Repeat(client, prefix).get(f"{prefix}-q", "t.workers_only") is not None
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        celeryd_after_setup.send(sender="w@h", instance=SimpleNamespace(app=plain), conf=None)
    assert Repeat(client, prefix).get(f"{prefix}-q", "t.workers_only") is None
    assert f"- {prefix}-q/t.workers_only" in caplog.text
    # An app that names no registry and declares nothing: left alone, no alarm.
    caplog.clear()
    elsewhere = Celery("elsewhere", broker="amqp://127.0.0.1:5672//", set_as_current=False)
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        celeryd_after_setup.send(sender="w@h", instance=SimpleNamespace(app=elsewhere), conf=None)
    elsewhere.close()
    assert "emq-bridge" not in caplog.text and "sync" not in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_real_worker_whose_code_lost_its_last_decorator_prunes_the_schedule_at_start(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue, repeat = f"{prefix}-q", Repeat(client, prefix)
    # Its @recurring removed: the module declares none now.
    env = app_module(tmp_path, "plainapp", "plainapp.job", redis_url, prefix, queue)
    # What the version with the decorator synced (a worker-only module: no beat prunes it).
    declared = Schedule(every="1h").bind("plainapp.job", queue)
    sync(repeat, [declared], "celery.plainapp.recurring", prune=False)
    log = tmp_path / "worker.log"
    args = ["worker", "-P", "solo", "-Q", queue, "--without-mingle", "--without-gossip"]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "plainapp", *args, "-l", "info"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "ready." in log.read_text(), 60, "the worker", then=log.read_text)
        assert repeat.get(queue, "plainapp.job") is None, log.read_text()[-3000:]
        assert f"sync celery.plainapp.recurring: - {queue}/plainapp.job" in log.read_text()
    finally:
        stop(worker)


def test_a_sync_names_the_first_schedules_it_kept_at_info_and_counts_them_all(
    prefix: str, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Worker pools of one source that know other tasks keep each other's at each full sync.
    repeat, queue = Repeat(client, prefix), f"{prefix}-q"
    others = [Schedule(every="1h").bind(f"t.other{i:02d}", queue) for i in range(25)]
    sync(repeat, others, "pools", prune=False)
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        plan = sync(repeat, [], "pools", prune_tasks={"t.mine"})
    assert len(plan.kept) == 25 and plan.remove == []
    named = [r for r in caplog.records if ": kept " in r.getMessage()]
    assert len(named) == 20
    assert "sync pools: 5 more kept (listed at DEBUG)" in caplog.text
    assert "sync pools: 0 created, 0 updated, 0 unchanged, 0 removed, 25 kept" in caplog.text
