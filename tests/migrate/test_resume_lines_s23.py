"""The cut-over's `--resume` says one thing of a registration a beat took over during the
paused staging: that it resumed it. Before, the same schedule got two lines that contradict
each other, `! ... left alone` (another source owns it now) and then `> resumed <queue>/<name>`,
in the dry run too, the summary counted it refused as well as resumed, and `--strict` refused
the whole cut-over for it (found by a probe of migration.md's staging with a real
`celery beat -S emq`). A schedule really left alone (another source's, not resumed) keeps its
`!` line."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from beats import beat_app, run_beat
from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry
from registry_state import snapshot

from emq_bridge import Repeat


def staged_and_taken_over(
    run: Run, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery, moved: bool
) -> tuple[tuple[str, ...], str, str]:
    """redbeat's entries imported `--paused` (one the app's beat_schedule declares too, one of
    redbeat's own), then a beat's boot sync and ticks that take the first over, still paused.
    Returns the import's arguments, the queue it imported into and the app's queue."""
    main = f"{prefix}-main"
    imported_into = f"{prefix}-celery" if moved else main
    every = schedule(timedelta(minutes=5))
    RedBeatSchedulerEntry("static", "app.t", every, app=redbeat_app).save()
    RedBeatSchedulerEntry("dynamic", "app.t", every, app=redbeat_app).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = (
        "import",
        "redbeat",
        "--from",
        redis_url,
        "--prefix",
        key_prefix,
        "--queue",
        imported_into,
    )
    staged = run(*args, "--paused")
    assert staged.exit_code == 0, staged.output

    app = beat_app(
        f"beatr-{prefix}",
        redis_url,
        prefix,
        main,
        {"static": {"task": "app.t", "schedule": timedelta(minutes=5)}},
        emq_bridge_queues=[imported_into],
    )
    run_beat(app, 2)  # its boot sync takes `static` over, keeping the pause
    taken = repeat.get(main, "static")
    assert taken is not None and taken.paused and taken.source == f"celery.beatr-{prefix}"
    return args, imported_into, main


@pytest.mark.parametrize("moved", [False, True], ids=["same-queue", "other-queue"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["write", "dry-run"])
def test_the_cut_over_says_only_resumed_of_a_schedule_a_beat_took_over(
    run: Run,
    repeat: Repeat,
    redis_url: str,
    prefix: str,
    redbeat_app: Celery,
    moved: bool,
    dry_run: bool,
) -> None:
    args, imported_into, main = staged_and_taken_over(
        run, repeat, redis_url, prefix, redbeat_app, moved
    )
    before = snapshot(repeat)
    flags = ("--resume", "--dry-run") if dry_run else ("--resume",)
    cut_over = run(*args, *flags)
    assert cut_over.exit_code == 0, cut_over.output
    lines = cut_over.stdout.splitlines()
    assert [line for line in lines if "static" in line] == [f"> resumed {main}/static"]
    assert sorted(line for line in lines if line.startswith(("!", ">"))) == sorted(
        [f"> resumed {main}/static", f"> resumed {imported_into}/dynamic"]
    )
    summary = cut_over.stderr.splitlines()[-1]
    assert "0 created, 0 updated, 1 unchanged, 0 refused, 2 resumed" in summary, summary
    if dry_run:
        assert snapshot(repeat) == before
        return
    resumed = repeat.get(main, "static")
    assert resumed is not None and not resumed.paused

    # Once resumed, it is really left alone: run again, the import says so with `!`.
    again = run(*args, "--resume")
    assert again.exit_code == 0, again.output
    refused = [line for line in again.stdout.splitlines() if line.startswith(("!", ">"))]
    assert len(refused) == 1 and refused[0].startswith("! ") and "static" in refused[0]
    assert "1 refused" in again.stderr.splitlines()[-1]


@pytest.mark.parametrize("moved", [False, True], ids=["same-queue", "other-queue"])
def test_strict_and_json_cut_over_of_a_schedule_a_beat_took_over(
    run: Run, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery, moved: bool
) -> None:
    args, imported_into, main = staged_and_taken_over(
        run, repeat, redis_url, prefix, redbeat_app, moved
    )
    dry = run(*args, "--resume", "--strict", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    said = json.loads(dry.stdout)
    assert said["refused"] == []
    assert sorted((e["queue"], e["name"]) for e in said["resumed"]) == sorted(
        [(main, "static"), (imported_into, "dynamic")]
    )
    cut_over = run(*args, "--resume", "--strict")
    assert cut_over.exit_code == 0, cut_over.output
    assert not cut_over.stdout.count("!"), cut_over.stdout
    for queue, name in ((main, "static"), (imported_into, "dynamic")):
        registration = repeat.get(queue, name)
        assert registration is not None and not registration.paused, (queue, name)
