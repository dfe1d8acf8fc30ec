"""An unchanged beat restart skips the conversion and the sync (`boot_schedule`), in process.

The fingerprint (`app_fingerprint`) must change with everything the conversion reads, stay
the same across processes for the same app, and be None for what it cannot pin; a boot
that finds its stamp reads three things and writes nothing, and any other writer of the
app's schedules makes the next boot sync in full.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.schedules import crontab, schedule, solar

from emq_bridge import ConfigError, Repeat
from emq_bridge.celery import RepeatScheduler, recurring
from emq_bridge.celery.beat import BeatRefused
from emq_bridge.celery.declare import _DECLARED, _beat_entries
from emq_bridge.celery.fingerprint import app_fingerprint
from emq_bridge.sync import sync
from emq_bridge.testing import ManualClock

UNCHANGED = "unchanged since its last sync"


def record(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Callable[..., Celery]]:
    apps: list[Celery] = []

    def build(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
        app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
        app.conf.update(
            timezone="Europe/Paris",
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule=beat_schedule if beat_schedule is not None else ENTRIES,
            result_backend=None,
            result_expires=None,
        )
        app.conf.update(conf)
        app.task(name="t.record", shared=False)(record)
        app.task(name="t.other", shared=False)(record)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


ENTRIES = {
    "a": {"task": "t.record", "schedule": 5, "args": [1], "kwargs": {"k": "v"}},
    "b": {"task": "t.other", "schedule": timedelta(minutes=1), "options": {"queue": "low"}},
    "c": {"task": "t.record", "schedule": crontab(minute="*/15"), "overlap": "skip"},
}


def fingerprint(app: Celery) -> str | None:
    return app_fingerprint(app, _beat_entries(app), _DECLARED)


def boot(app: Celery, caplog: pytest.LogCaptureFixture) -> tuple[RepeatScheduler, bool]:
    """Start the beat's scheduler; return it and whether its boot found its stamp."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        scheduler = RepeatScheduler(app)
    return scheduler, any(UNCHANGED in r.getMessage() for r in caplog.records)


def server_counts(client: redis.Redis) -> tuple[int, int]:
    """(scripts run, keys changed) on the server."""
    stats = client.info("commandstats")
    scripts = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
    return scripts, int(client.info("persistence")["rdb_changes_since_last_save"])


def test_an_unchanged_restart_converts_nothing_reads_no_record_and_pumps_as_before(
    make_app: Callable[..., Celery],
    client: redis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, found = boot(make_app(), caplog)
    assert not found
    queues, names = first.plan.queues, sorted(first.pump.repeat.names(f"{prefix}-q"))  # type: ignore[union-attr]
    first.close()
    before = server_counts(client)

    second, found = boot(make_app(), caplog)

    assert found
    assert server_counts(client) == before  # no script (no fetch, no upsert), no write
    assert second.plan.queues == queues and second.plan.count == 3  # type: ignore[union-attr]
    assert sorted(second.pump.repeat.names(f"{prefix}-q")) == names  # type: ignore[union-attr]
    # It pumps what the first boot synced: a is due every 5 s.
    clock = ManualClock(second.pump.repeat.server_time_ms())  # type: ignore[union-attr]
    second.pump.clock = clock  # type: ignore[union-attr]
    clock.advance(5000)
    second.tick()
    assert client.llen(f"{prefix}-q") >= 1
    second.close()


def test_a_changed_declaration_syncs_in_full_and_stamps_again(
    make_app: Callable[..., Celery], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    boot(make_app(), caplog)[0].close()
    changed = {**ENTRIES, "a": {**ENTRIES["a"], "args": [2]}}

    scheduler, found = boot(make_app(changed), caplog)
    assert not found
    repeat: Repeat = scheduler.pump.repeat  # type: ignore[union-attr]
    assert repeat.get(f"{prefix}-q", "a").definition.template["args"] == [2]  # type: ignore[union-attr]
    scheduler.close()
    again, found = boot(make_app(changed), caplog)
    assert found
    again.close()


@pytest.mark.parametrize(
    "other_writer",
    [
        pytest.param(lambda r, q: r.cancel(q, "a"), id="a cancel by hand"),
        pytest.param(
            lambda r, q: r.upsert(q, "a", every="1h", template={"task": "t.record"}),
            id="an upsert through the API",
        ),
        pytest.param(lambda r, q: r.client.delete(r.keys(q).synced), id="the stamps deleted"),
    ],
)
def test_another_writer_makes_the_next_boot_sync_in_full_and_put_the_entry_back(
    make_app: Callable[..., Celery],
    client: redis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    other_writer: Callable[[Repeat, str], Any],
) -> None:
    first, _ = boot(make_app(), caplog)
    repeat: Repeat = first.pump.repeat  # type: ignore[union-attr]
    synced = repeat.get(f"{prefix}-q", "a").definition  # type: ignore[union-attr]
    first.close()
    other_writer(Repeat(client, prefix), f"{prefix}-q")

    second, found = boot(make_app(), caplog)

    assert not found
    assert second.pump.repeat.get(f"{prefix}-q", "a").definition == synced  # type: ignore[union-attr]
    second.close()
    assert boot(make_app(), caplog)[1]  # stamped again


def test_a_worker_boot_that_changes_a_decorated_task_makes_the_beat_sync_in_full(
    make_app: Callable[..., Celery], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from emq_bridge.celery import sync_app

    beat_app = make_app()
    recurring(every="1h", name="hourly")(beat_app.tasks["t.other"])
    try:
        boot(beat_app, caplog)[0].close()
        worker_app = make_app()
        recurring(every="2h", name="hourly")(worker_app.tasks["t.other"])  # an older config
        sync_app(worker_app, beat=False)
        scheduler, found = boot(beat_app, caplog)
        assert not found
        hourly = scheduler.pump.repeat.get(f"{prefix}-q", "hourly")  # type: ignore[union-attr]
        assert hourly is not None and hourly.definition.cadence.describe() == "every 1h"
        scheduler.close()
    finally:
        del _DECLARED[-2:]


def test_a_worker_converts_only_its_decorated_tasks(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis
) -> None:
    from emq_bridge.celery import sync_app

    # The beat's entries are the beat's to check: a worker syncs its decorated tasks anyway.
    app = make_app({"bad": {"task": "t.unknown", "schedule": 5}})
    recurring(every="1h", name="hourly")(app.tasks["t.other"])
    try:
        [plan] = sync_app(app, beat=False)
    finally:
        del _DECLARED[-1:]
    assert [d.name for d in plan.create] == ["hourly"]
    assert Repeat(client, prefix).names(f"{prefix}-q") == ["hourly"]


def test_the_setting_turns_the_stamp_off(
    make_app: Callable[..., Celery], caplog: pytest.LogCaptureFixture
) -> None:
    boot(make_app(), caplog)[0].close()
    scheduler, found = boot(make_app(emq_bridge_boot_stamp=False), caplog)
    assert not found
    scheduler.close()


def test_a_custom_schedule_is_never_stamped(
    make_app: Callable[..., Celery], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    entries = {**ENTRIES, "sun": {"task": "t.record", "schedule": solar("sunrise", 48.85, 2.35)}}
    for _ in range(2):
        scheduler, found = boot(make_app(entries), caplog)
        assert not found
        assert scheduler.plan is not None and scheduler.plan.custom  # the live object is kept
        scheduler.close()


def unchanged_sources(caplog: pytest.LogCaptureFixture) -> set[str]:
    """The sources the last boot found unchanged (its stamp held)."""
    found = (re.search(r"emq-bridge: (\S+) " + UNCHANGED, r.getMessage()) for r in caplog.records)
    return {m.group(1) for m in found if m}


def test_the_schedule_file_is_stamped_on_its_own(
    make_app: Callable[..., Celery], prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "schedules.toml"
    body = f'source = "{prefix}-file"\nqueue = "{prefix}-file"\n\n[[schedule]]\nname = "f"\n'
    path.write_text(body + 'every = "1m"\ntask = "t.record"\n')
    app_source, file_source = f"celery.app-{prefix}", f"{prefix}-file"

    def booted() -> tuple[RepeatScheduler, set[str]]:
        scheduler, _ = boot(make_app(emq_bridge_schedule_file=str(path)), caplog)
        return scheduler, unchanged_sources(caplog)

    scheduler, unchanged = booted()
    assert unchanged == set()
    scheduler.close()
    # The file's queue is new to the app's stamp (read before the file created it): the app
    # syncs in full once more; the file, unchanged, is not read.
    scheduler, unchanged = booted()
    assert unchanged == {file_source}
    scheduler.close()
    path.write_text(body + 'every = "2m"\ntask = "t.record"\n')

    scheduler, unchanged = booted()

    assert unchanged == {app_source}
    assert f"{prefix}-file" in scheduler.plan.queues  # type: ignore[union-attr]
    f = scheduler.pump.repeat.get(f"{prefix}-file", "f")  # type: ignore[union-attr]
    assert f is not None and f.definition.cadence.describe() == "every 2m"
    scheduler.close()
    scheduler, unchanged = booted()
    assert unchanged == {app_source, file_source}
    assert f"{prefix}-file" in scheduler.plan.queues  # type: ignore[union-attr]
    scheduler.close()


# -- the fingerprint ----------------------------------------------------------------------


def route_by_name(name: str, *args: Any, **kwargs: Any) -> dict[str, str]:
    return {"queue": "routed"}


class Subclassed(schedule):  # type: ignore[misc]
    pass


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"beat_schedule": {**ENTRIES, "d": ENTRIES["a"]}}, id="an entry added"),
        pytest.param(
            {"beat_schedule": {**ENTRIES, "a": {**ENTRIES["a"], "kwargs": {"k": "w"}}}}, id="kwargs"
        ),
        pytest.param(
            {
                "beat_schedule": {
                    **ENTRIES,
                    "c": {**ENTRIES["c"], "schedule": crontab(minute="*/5")},
                }
            },
            id="crontab",
        ),
        pytest.param({"timezone": "UTC"}, id="timezone"),
        pytest.param({"task_routes": {"t.record": {"queue": "hi"}}}, id="task_routes"),
        pytest.param({"task_default_queue": "other"}, id="default queue"),
        pytest.param({"emq_bridge_generation": 7}, id="generation"),
        pytest.param({"emq_bridge_source": "mine"}, id="source"),
        pytest.param({"beat_cron_starting_deadline": 30}, id="cron deadline"),
    ],
)
def test_the_fingerprint_changes_with_what_the_conversion_reads(
    make_app: Callable[..., Celery], change: dict[str, Any]
) -> None:
    base = fingerprint(make_app())
    assert base is not None and base == fingerprint(make_app())
    assert fingerprint(make_app(**change)) not in (None, base)


def test_the_fingerprint_reads_settings_given_django_style(
    make_app: Callable[..., Celery],
) -> None:
    # Before: `config_from_object(..., namespace="CELERY")` lists the setting as
    # CELERY_EMQ_BRIDGE_GENERATION, which the fingerprint skipped: a deploy raising only the
    # generation found its stamp, never wrote the new generation, and an old worker then
    # reverted a schedule the newer generation should have protected.
    found = []
    for generation in (1, 2, 2):
        app = make_app()
        settings = type("Settings", (), {"CELERY_EMQ_BRIDGE_GENERATION": generation})
        app.config_from_object(settings, namespace="CELERY")
        assert app.conf.get("emq_bridge_generation") == generation
        found.append(fingerprint(app))
    assert None not in found and found[0] != found[1] and found[1] == found[2]


def test_the_fingerprint_changes_with_a_decorated_tasks_schedule(
    make_app: Callable[..., Celery],
) -> None:
    found = []
    for every in ("1h", "2h", "1h"):
        app = make_app()
        recurring(every=every, name="hourly", kwargs={"k": 1})(app.tasks["t.other"])
        try:
            found.append(fingerprint(app))
        finally:
            del _DECLARED[-1:]
    assert None not in found and found[0] != found[1] and found[0] == found[2]


def test_the_fingerprint_changes_with_a_tasks_own_queue(make_app: Callable[..., Celery]) -> None:
    base = fingerprint(make_app())
    app = make_app()
    app.tasks["t.record"].queue = "own"
    assert fingerprint(app) not in (None, base)


@pytest.mark.parametrize(
    "conf",
    [
        pytest.param({"task_routes": (route_by_name,)}, id="a router function"),
        pytest.param({"task_routes": ["myapp.routers.route"]}, id="a router path"),
        pytest.param(
            {"beat_schedule": {"s": {"task": "t.record", "schedule": Subclassed(5)}}},
            id="a schedule subclass",
        ),
        pytest.param(
            {"beat_schedule": {"r": {"task": "t.record", "schedule": schedule(5, relative=True)}}},
            id="a relative schedule",
        ),
        pytest.param(
            {"beat_schedule": {"x": {"task": "t.record", "schedule": 5, "args": [lambda: 1]}}},
            id="an unpicklable argument",
        ),
    ],
)
def test_what_cannot_be_pinned_has_no_fingerprint(
    make_app: Callable[..., Celery], conf: dict[str, Any]
) -> None:
    assert fingerprint(make_app(**conf)) is None


FINGERPRINT_CHILD = textwrap.dedent("""
    from datetime import timedelta
    from celery import Celery
    from celery.schedules import crontab
    from kombu import Exchange, Queue
    from emq_bridge.celery.declare import _DECLARED, _beat_entries
    from emq_bridge.celery.fingerprint import app_fingerprint

    app = Celery("same", set_as_current=False)
    app.conf.update(timezone="Europe/Paris", result_expires=None)
    app.conf.task_routes = {"t.*": {"queue": "q"}}
    app.conf.task_queues = [Queue("q", Exchange("x", type="direct"), routing_key="q")]


    def record(*args, **kwargs):
        return None


    app.task(name="t.record", shared=False)(record)
    app.conf.beat_schedule = {
        f"job-{i}": {"task": "t.record", "schedule": timedelta(hours=1), "args": [i, "x"],
                     "kwargs": {"tenant": f"t{i}", "opts": {"a": [1.5, None, True]}}}
        for i in range(100)
    }
    cron = crontab(minute="0", hour="*/2")
    app.conf.beat_schedule["cron"] = {"task": "t.record", "schedule": cron}
    print(app_fingerprint(app, _beat_entries(app), _DECLARED))
""")


def test_the_fingerprint_is_the_same_in_every_process_of_the_same_app() -> None:
    found = set()
    for seed in ("0", "1", "12345"):
        done = subprocess.run(
            [sys.executable, "-c", FINGERPRINT_CHILD],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        found.add(done.stdout.strip())
    assert len(found) == 1 and "None" not in found


def test_a_schedule_file_declaring_a_beat_schedule_name_stops_the_boot(
    make_app: Callable[..., Celery], prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        f'source = "{prefix}-file"\nqueue = "{prefix}-q"\n\n'
        '[[schedule]]\nname = "a"\ntask = "t.record"\nevery = "10s"\n'
    )
    app = make_app(emq_bridge_schedule_file=str(path))
    with pytest.raises(BeatRefused, match=rf"{prefix}-q/a is declared by both celery.app-"):
        boot(app, caplog)
    assert Repeat(redis.Redis.from_url(app.conf.broker_url), prefix).names(f"{prefix}-q") == []


def test_a_worker_refuses_a_decorated_task_that_is_a_beat_schedule_entry_too(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis
) -> None:
    # Before: the worker's boot rewrote the beat's entry "a" with its task's schedule, which
    # the beat of the same code then refused to start with ("declared twice").
    from emq_bridge.celery import sync_app

    beat_app = make_app()
    boot_sync = sync_app(beat_app)
    assert [d.name for d in boot_sync[0].create] == ["a", "b", "c"]
    before = Repeat(client, prefix).get(f"{prefix}-q", "a")
    app = make_app()
    recurring(every="3m", name="a")(app.tasks["t.other"])
    try:
        with pytest.raises(ConfigError, match=f"schedule {prefix}-q/a is declared twice"):
            sync_app(app, beat=False)
    finally:
        del _DECLARED[-1:]
    assert Repeat(client, prefix).get(f"{prefix}-q", "a") == before
    # The same name on another queue is another registration: the worker syncs it.
    other = make_app()
    recurring(every="3m", name="b", options={"queue": f"{prefix}-else"})(other.tasks["t.other"])
    try:
        [plan] = sync_app(other, beat=False)
    finally:
        del _DECLARED[-1:]
    assert [(d.queue, d.name) for d in plan.create] == [(f"{prefix}-else", "b")]


def file_of(path: Path, prefix: str, name: str, queue: str) -> None:
    path.write_text(
        f'source = "{prefix}-file"\nqueue = "{queue}"\n\n'
        f'[[schedule]]\nname = "{name}"\ntask = "t.record"\nevery = "10s"\n'
    )


def test_an_entry_taking_the_name_of_an_unchanged_files_schedule_stops_the_boot(
    make_app: Callable[..., Celery], prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The file's stamp holds, so the file is not read: the app's sync checks its names in the
    # registry before any write (it took "f" from the file, and the next boot, reading the
    # file again, refused the app: the owner flipped at every other boot).
    path = tmp_path / "schedules.toml"
    file_of(path, prefix, "f", f"{prefix}-q")
    for _ in range(2):  # the second boot stamps the app with the file's queue known
        scheduler, _ = boot(make_app(emq_bridge_schedule_file=str(path)), caplog)
        scheduler.close()
    repeat = Repeat(redis.Redis.from_url(scheduler.app.conf.broker_url), prefix)
    before = {r.name: r for r in repeat.list(f"{prefix}-q")}
    entries = {**ENTRIES, "f": {"task": "t.other", "schedule": 60}}

    with pytest.raises(BeatRefused, match=rf"{prefix}-q/f is declared by both {prefix}-file and"):
        boot(make_app(entries, emq_bridge_schedule_file=str(path)), caplog)

    assert {r.name: r for r in repeat.list(f"{prefix}-q")} == before


def test_a_file_taking_the_name_of_an_unchanged_apps_schedule_stops_the_boot(
    make_app: Callable[..., Celery], prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The app's stamp holds, so its beat_schedule is not converted: the file's sync checks
    # its names in the registry before any write.
    path = tmp_path / "schedules.toml"
    file_of(path, prefix, "f", f"{prefix}-q")
    for _ in range(2):
        scheduler, _ = boot(make_app(emq_bridge_schedule_file=str(path)), caplog)
        scheduler.close()
    repeat = Repeat(redis.Redis.from_url(scheduler.app.conf.broker_url), prefix)
    before = {r.name: r for r in repeat.list(f"{prefix}-q")}
    file_of(path, prefix, "a", f"{prefix}-q")

    with pytest.raises(BeatRefused, match=rf"{prefix}-q/a is declared by both celery.app-"):
        boot(make_app(emq_bridge_schedule_file=str(path)), caplog)

    assert {r.name: r for r in repeat.list(f"{prefix}-q")} == before


def test_a_worker_refuses_a_decorated_task_that_is_a_schedule_files_schedule(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    from emq_bridge.celery import sync_app

    path = tmp_path / "schedules.toml"
    file_of(path, prefix, "f", f"{prefix}-q")
    sync_app(make_app(emq_bridge_schedule_file=str(path)))
    before = Repeat(client, prefix).get(f"{prefix}-q", "f")
    app = make_app(emq_bridge_schedule_file=str(path))
    recurring(every="3m", name="f")(app.tasks["t.other"])
    try:
        with pytest.raises(ConfigError, match=rf"{prefix}-q/f is declared by both {prefix}-file"):
            sync_app(app, beat=False)
    finally:
        del _DECLARED[-1:]
    assert Repeat(client, prefix).get(f"{prefix}-q", "f") == before


def test_a_sync_that_removes_schedules_in_queues_the_app_does_not_use_says_why(
    make_app: Callable[..., Celery], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Two services both named `Celery("app-<prefix>")` on one registry share the source
    # `celery.app-<prefix>`: each beat's sync removes the other's schedules. The log says
    # so, with the setting that separates them.
    first, _ = boot(make_app(), caplog)
    first.close()
    other = {"digest": {"task": "t.other", "schedule": 60}}
    second, _ = boot(make_app(other, task_default_queue=f"{prefix}-mail"), caplog)
    second.close()
    [line] = [r.getMessage() for r in caplog.records if "does not pump" in r.getMessage()]
    assert f"queue(s) low, {prefix}-q," in line and "emq_bridge_source" in line


def test_entry_keys_that_differ_only_by_whitespace_are_one_name_and_refused(
    make_app: Callable[..., Celery],
    prefix: str,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    entries = {
        "report daily": {"task": "t.record", "schedule": 60},
        "report_daily": {"task": "t.other", "schedule": 60},
    }
    with pytest.raises(BeatRefused, match=rf"schedule {prefix}-q/report_daily is declared twice"):
        boot(make_app(entries), caplog)
    assert Repeat(client, prefix).names(f"{prefix}-q") == []


def test_a_recurring_task_only_the_workers_import_stays_across_beat_starts(
    make_app: Callable[..., Celery],
    prefix: str,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # docs/celery.md (who syncs what): the beat prunes the @recurring tasks' schedules only
    # of tasks it knows; one whose task it does not import is left, and said so.
    from emq_bridge.celery import sync_app

    worker_app = make_app()
    worker_app.task(name="t.workers_only", shared=False)(record)
    recurring(every="1h", name="workers-only")(worker_app.tasks["t.workers_only"])
    repeat = Repeat(client, prefix)
    try:
        [created] = sync_app(worker_app, beat=False)
        assert created.source == f"celery.app-{prefix}.recurring"
        before = repeat.get(f"{prefix}-q", "workers-only")
        assert before is not None
        for _ in range(2):  # a beat that does not import it, started twice
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="emq_bridge"):
                entries, tasks = sync_app(make_app())
            assert entries.remove == [] and tasks.remove == []
            assert tasks.kept == [(f"{prefix}-q", "workers-only", "t.workers_only")]
            assert f"kept {prefix}-q/workers-only: its task t.workers_only is not" in caplog.text
            after = repeat.get(f"{prefix}-q", "workers-only")
            assert after is not None and after.next_run_ms == before.next_run_ms
        # A beat that knows the task, now without its decorator, removes its schedule.
        knows_it = make_app()
        knows_it.task(name="t.workers_only", shared=False)(record)
        _, tasks = sync_app(knows_it)
        assert tasks.remove == [(f"{prefix}-q", "workers-only")] and tasks.kept == []
        assert repeat.get(f"{prefix}-q", "workers-only") is None
    finally:
        del _DECLARED[-1:]


def test_a_beat_takes_over_the_recurring_tasks_an_older_version_synced_keeping_their_runs(
    make_app: Callable[..., Celery], prefix: str, client: redis.Redis
) -> None:
    # Before the tasks had a source of their own, the beat synced them under the app's: the
    # first boot of this version takes them over (an owner change, no cadence change), where
    # the beat_schedule sync alone would have removed them. A task only the workers import is
    # not one the beat declares: that first boot removes it, as every boot of the older
    # version did, and the next start of a worker writes it back for good.
    from emq_bridge.celery import sync_app
    from emq_bridge.celery.declare import decorated_schedule

    repeat = Repeat(client, prefix)
    app = make_app()
    worker_app = make_app()
    worker_app.task(name="t.workers_only", shared=False)(record)
    recurring(every="1h", name="hourly")(app.tasks["t.other"])
    recurring(every="1h", name="hourly")(worker_app.tasks["t.other"])  # the same code
    recurring(every="2h", name="workers-only")(worker_app.tasks["t.workers_only"])
    try:
        older = [*decorated_schedule(worker_app).tasks]
        old_source = f"celery.app-{prefix}"
        sync(repeat, older, old_source, prune=False)
        runs = {n: repeat.get(f"{prefix}-q", n).next_run_ms for n in ("hourly", "workers-only")}  # type: ignore[union-attr]
        entries, tasks = sync_app(app)
        assert [d.name for d in tasks.update] == ["hourly"] and tasks.remove == []
        assert entries.remove == [(f"{prefix}-q", "workers-only")]
        hourly = repeat.get(f"{prefix}-q", "hourly")
        assert hourly is not None and hourly.next_run_ms == runs["hourly"]
        assert hourly.source == f"{old_source}.recurring"
        sync_app(worker_app, beat=False)
        for _ in range(2):
            entries, tasks = sync_app(app)
            assert entries.remove == tasks.remove == [] and entries.changes == tasks.changes == 0
            found = repeat.get(f"{prefix}-q", "workers-only")
            assert found is not None and found.source == f"{old_source}.recurring"
    finally:
        del _DECLARED[-3:]
