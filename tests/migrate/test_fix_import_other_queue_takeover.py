"""A `beat_schedule` entry that celery-redbeat stored too, imported into the import's queue
(`--queue`, `celery` by default) while the app sends its tasks to another default queue, is
taken over by the beat's own declaration as it is in the same queue: one schedule, sent
once a slot. Before, the import's copy stayed in `celery`; once that queue was pumped (the
import's `note:` line and docs/migration.md say to list it in `emq_bridge_queues`), both
fired every slot with different ids and the worker ran the task twice (found by a probe of
the cut-over with real beats)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from beats import beat_app, run_beat
from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry
from registry_state import snapshot

from emq_bridge import Declaration, Repeat, define
from emq_bridge.sync import apply_plan, plan_sync, sync


def sent_schedules(client: redis.Redis, queue: str) -> Counter[str]:
    """How many task messages wait in a Redis-broker queue, per `emq_schedule` header."""
    found: Counter[str] = Counter()
    for key in [queue, *(f"{queue}\x06\x16{n}" for n in range(10))]:
        for raw in client.lrange(key, 0, -1):
            message: dict[str, Any] = json.loads(raw)
            found[message["headers"]["emq_schedule"]] += 1
    return found


def test_the_beat_takes_over_an_entry_redbeat_stored_that_was_imported_into_another_queue(
    run: Run,
    client: redis.Redis,
    repeat: Repeat,
    redis_url: str,
    prefix: str,
    redbeat_app: Celery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    main, imported_into = f"{prefix}-main", f"{prefix}-celery"
    every = schedule(timedelta(seconds=1))
    # What redbeat's beat stores of the app's beat_schedule, and a schedule of its own that
    # shares a name with nothing the app declares, and one that shares a name but not a task.
    RedBeatSchedulerEntry("static", "app.t", every, args=[7], app=redbeat_app).save()
    RedBeatSchedulerEntry("dynamic", "app.t", every, app=redbeat_app).save()
    RedBeatSchedulerEntry("other-task", "app.u", every, app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    imported = run(*args, "--queue", imported_into)
    assert imported.exit_code == 0, imported.output
    assert "3 created" in imported.stderr

    app = beat_app(
        f"beatt-{prefix}",
        redis_url,
        prefix,
        main,
        {
            "static": {"task": "app.t", "schedule": timedelta(seconds=1), "args": [7]},
            "other-task": {"task": "app.t", "schedule": timedelta(seconds=1)},
        },
        # As the note says: the queue the import wrote to is listed, so its schedules run.
        emq_bridge_queues=[imported_into],
    )
    caplog.set_level(logging.INFO, logger="emq_bridge.sync")
    ticks = 4
    run_beat(app, ticks)

    # What migration.md says its log tells.
    said = [r.getMessage() for r in caplog.records if "takes over" in r.getMessage()]
    assert said == [
        f"sync: {main}/static takes over {imported_into}/static of import:redbeat: "
        f"the same schedule, imported into queue '{imported_into}'"
    ]
    owners = {
        (r.queue, r.name): r.source for q in (main, imported_into) for r in repeat.iter_list(q)
    }
    source = f"celery.beatt-{prefix}"
    assert owners == {
        (main, "static"): source,  # taken over, out of the import's queue
        (imported_into, "dynamic"): "import:redbeat",  # the app declares no such schedule
        (main, "other-task"): source,
        (imported_into, "other-task"): "import:redbeat",  # another task: another schedule
    }
    sent = sent_schedules(client, main) + sent_schedules(client, imported_into)
    assert sent[f"{imported_into}/static"] == 0
    assert 1 <= sent[f"{main}/static"] <= ticks  # one schedule, at most one send a slot
    assert sent[f"{imported_into}/dynamic"] >= 1
    assert sent[f"{imported_into}/other-task"] >= 1 and sent[f"{main}/other-task"] >= 1

    # The import run again (it says re-running changes nothing) does not bring the copy
    # back into its queue: the schedule is the beat's now, in the app's queue.
    again = run(*args, "--queue", imported_into)
    assert again.exit_code == 0, again.output
    assert f"{main}/static of the source '{source}' is this schedule" in again.output
    assert "0 created" in again.stderr
    assert {r.name for r in repeat.iter_list(imported_into)} == {"dynamic", "other-task"}


def test_a_dry_run_says_what_it_would_take_over_and_writes_nothing(
    run: Run, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery
) -> None:
    main, imported_into = f"{prefix}-main", f"{prefix}-celery"
    every = schedule(timedelta(minutes=5))
    RedBeatSchedulerEntry("static", "app.t", every, app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert run(*args, "--queue", imported_into).exit_code == 0
    before = snapshot(repeat)
    declared = [Declaration(main, "static", define(every="5m", template={"task": "app.t"}))]
    plan = plan_sync(repeat, declared, "app")
    assert plan.adopted == {(main, "static"): (imported_into, "import:redbeat")}
    assert plan.lines() == [
        f"+ {main}/static  every 5m  (takes over {imported_into}/static of import:redbeat)"
    ]
    assert snapshot(repeat) == before
    applied = apply_plan(repeat, plan)
    assert [(d.queue, d.name) for d in applied.update] == [(main, "static")]  # taken over
    assert [(r.queue, r.name, r.source) for r in repeat.iter_list(main)] == [
        (main, "static", "app")
    ]
    assert list(repeat.iter_list(imported_into)) == []


@pytest.mark.parametrize("moved", [False, True], ids=["same-queue", "other-queue"])
def test_a_beat_started_during_the_paused_staging_is_resumed_by_the_cut_over(
    run: Run, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery, moved: bool
) -> None:
    # Before: the beat took the paused registration over (keeping the pause, as it should
    # while redbeat runs), and `--resume` then left it alone as another source's: paused for
    # good (found by a probe of migration.md's cut-over with a beat running during staging).
    main = f"{prefix}-main"
    imported_into = f"{prefix}-celery" if moved else main
    every = schedule(timedelta(minutes=5))
    RedBeatSchedulerEntry("static", "app.t", every, app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert run(*args, "--queue", imported_into, "--paused").exit_code == 0
    staged = repeat.get(imported_into, "static")
    assert staged is not None and staged.paused and staged.paused_by == "import:redbeat"
    shown = run("show", imported_into, "static")
    assert "paused by import:redbeat" in shown.output, shown.output  # as migration.md says

    app = beat_app(
        f"beats-{prefix}",
        redis_url,
        prefix,
        main,
        {"static": {"task": "app.t", "schedule": timedelta(minutes=5)}},
        emq_bridge_queues=[imported_into],
    )
    run_beat(app, 0)  # its boot sync takes the registration over, still paused
    taken = repeat.get(main, "static")
    assert taken is not None and taken.paused and taken.source == f"celery.beats-{prefix}"

    cut_over = run(*args, "--queue", imported_into, "--resume")
    assert cut_over.exit_code == 0, cut_over.output
    assert f"> resumed {main}/static" in cut_over.output  # where it is now
    resumed = repeat.get(main, "static")
    assert resumed is not None and not resumed.paused and resumed.next_run_ms is not None
    assert resumed.source == f"celery.beats-{prefix}"


def test_a_schedule_file_dry_run_shows_what_it_would_take_over(
    run: Run, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery, tmp_path: Path
) -> None:
    # Before: `emq-bridge sync FILE --dry-run` printed its own plan lines, without the
    # takeover `SyncPlan.lines()` names (found by a probe).
    main, imported_into = f"{prefix}-main", f"{prefix}-celery"
    RedBeatSchedulerEntry("rt", "app.t", schedule(timedelta(seconds=4)), app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    imported = run(
        "import", "redbeat", "--from", redis_url, "--prefix", key_prefix, "--queue", imported_into
    )
    assert imported.exit_code == 0, imported.output
    path = tmp_path / "schedules.toml"
    path.write_text(
        f'source = "ops"\nqueue = "{main}"\n\n'
        '[[schedule]]\nname = "rt"\ntask = "app.t"\nevery = "4s"\n'
    )
    before = snapshot(repeat)
    dry = run("sync", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"+ {main}/rt  every 4s  (takes over {imported_into}/rt of import:redbeat)" in dry.output
    assert snapshot(repeat) == before


def test_a_sync_that_dies_between_the_cancel_and_the_create_leaves_one_schedule_next_time(
    run: Run,
    repeat: Repeat,
    redis_url: str,
    prefix: str,
    redbeat_app: Celery,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What migration.md says of a beat killed mid-move: the imported registration is gone,
    # the next sync creates the declaration from its cadence alone; never two of them.
    main, imported_into = f"{prefix}-main", f"{prefix}-celery"
    RedBeatSchedulerEntry("static", "app.t", schedule(timedelta(minutes=1)), app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert run(*args, "--queue", imported_into).exit_code == 0
    declared = [Declaration(main, "static", define(every="1m", template={"task": "app.t"}))]

    def killed(*_: Any, **__: Any) -> Any:
        raise SystemExit(137)  # the process dies after the cancel, before the create

    with monkeypatch.context() as patch:
        patch.setattr(Repeat, "upsert_many", killed)
        with pytest.raises(SystemExit):
            sync(repeat, declared, "app")
    assert list(repeat.iter_list(imported_into)) == []  # cancelled
    assert list(repeat.iter_list(main)) == []  # not created yet

    again = sync(repeat, declared, "app")
    assert [(d.queue, d.name) for d in again.create] == [(main, "static")]
    assert again.adopted == {}  # nothing left to move: its cadence alone
    found = [
        (r.queue, r.name, r.source) for q in (main, imported_into) for r in repeat.iter_list(q)
    ]
    assert found == [(main, "static", "app")]
