"""A schedule file that declares no schedule while its source has some (emptied, or cut at an
entry's boundary by a deploy) is refused before anything is written: by `emq-bridge sync`
(exit 1, one line; `--allow-empty` removes them on purpose, `--dry-run` shows the plan) and
by a Celery beat's boot sync of `emq_bridge_schedule_file`. Before (session 27's probe), a
0-byte file removed every schedule of its source, exit 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner, one_error_line

from emq_bridge import Repeat

FILE = """queue = "q"
[[schedule]]
name = "a"
task = "proj.run"
every = "1h"

[[schedule]]
name = "b"
task = "proj.run"
every = "1h"
"""


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def test_sync_refuses_an_emptied_file_unless_allowed(
    run: Run, repeat: Repeat, client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    assert run("sync", str(path)).exit_code == 0
    for emptied in ("", 'queue = "q"\n'):  # 0 bytes; cut after its first line
        path.write_text(emptied)
        error = one_error_line(run("sync", str(path)), 1)
        assert "declares no schedule: its sync would remove all 2 schedule(s) of source" in error
        assert "(--allow-empty removes them)" in error
        assert sorted(repeat.names("q")) == ["a", "b"]
    shown = run("sync", str(path), "--dry-run")
    assert shown.exit_code == 0 and "- q/a" in shown.stdout and "- q/b" in shown.stdout
    assert "note: without --dry-run: the schedule file declares no schedule" in shown.stderr
    assert sorted(repeat.names("q")) == ["a", "b"]
    assert run("sync", str(path), "--allow-empty").exit_code == 0
    assert repeat.names("q") == []
