"""A deploy that moves a beat's schedules to another queue (here `task_default_queue`) logs
each as a move, not as a removal and a creation, and not as schedules removed by another app
sharing the registry. Before (session 27's Celery idioms probe), every entry logged
`- old/a (was ...)` at WARNING and `+ new/a`, and the sync ended with a WARNING that another
app under the same source might have removed them, when nothing was lost."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from celery import Celery
from cli_runs import cli_runner

from emq_bridge import Repeat
from emq_bridge.celery import sync_app


def app_on(queue: str, redis_url: str, prefix: str) -> Celery:
    app = Celery("movelog", set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        emq_bridge_check_tasks=False,
        beat_schedule={"a": {"task": "proj.a", "schedule": 60.0}},
    )
    return app


def test_a_queue_move_is_logged_as_a_move(
    repeat: Repeat, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    sync_app(app_on("old", redis_url, prefix), repeat)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        sync_app(app_on("new", redis_url, prefix), repeat)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any(line.endswith(": > old/a moved to queue new") for line in said), said
    assert not any(": - old/a" in line or ": + new/a" in line for line in said), said
    assert not any("another app shares this registry" in line for line in said), said
    assert any(line.endswith("2 removed (2 of each a queue move)") for line in said), said
    assert "a" in repeat.names("new") and "a" not in repeat.names("old")


def test_the_cli_diff_and_summary_say_a_move(
    repeat: Repeat, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text('queue = "old"\n[[schedule]]\nname = "a"\ntask = "t"\nevery = "1h"\n')
    run = cli_runner(redis_url, prefix)
    assert run("sync", str(path)).exit_code == 0
    path.write_text('queue = "new"\n[[schedule]]\nname = "a"\ntask = "t"\nevery = "1h"\n')
    moved = run("sync", str(path))
    assert moved.exit_code == 0, moved.output
    lines = moved.stdout.splitlines()
    assert "+ new/a  every 1h  (moved from queue old)" in lines, lines
    assert "- old/a  every 1h  (moved to queue new)" in lines, lines
    assert "1 created, 0 updated, 1 removed, 0 unchanged (1 of each a queue move)" in moved.stderr
