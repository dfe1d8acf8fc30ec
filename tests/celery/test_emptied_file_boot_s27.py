"""A Celery beat whose `emq_bridge_schedule_file` declares no schedule while its source has
some (emptied, or cut by a deploy) refuses to boot before anything is written, as `emq-bridge
sync` refuses such a file (tests/core/test_emptied_file_s27.py). Before (session 27's probe),
its boot sync removed every schedule of the file's source."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from emq_bridge import Repeat
from emq_bridge.celery.declare import boot_schedule
from emq_bridge.errors import ConfigError

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


def test_a_beat_refuses_to_boot_on_an_emptied_file(
    repeat: Repeat, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    app = Celery("emptied", set_as_current=False)
    app.conf.update(
        emq_bridge_redis_url=redis_url, emq_bridge_prefix=prefix, emq_bridge_schedule_file=str(path)
    )

    @app.task(name="proj.run", shared=False)  # type: ignore[untyped-decorator]
    def run_it() -> None: ...

    path.write_text(FILE)
    boot_schedule(app, repeat)
    assert sorted(repeat.names("q")) == ["a", "b"]
    path.write_text("")
    with pytest.raises(ConfigError, match="the schedule file declares no schedule") as caught:
        boot_schedule(app, repeat)
    assert "(to remove them on purpose: emq-bridge sync FILE --allow-empty)" in str(caught.value)
    assert sorted(repeat.names("q")) == ["a", "b"]
