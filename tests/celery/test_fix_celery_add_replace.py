"""`emq-bridge add --celery SPEC --overlap replace` is taken: Celery can revoke the
occurrence that runs (its dispatcher has `revoke`), unlike Dramatiq, whose `add` refuses it
(tests/dramatiq/test_fix_dramatiq_add_overlap.py). A real app module, a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from emq_bridge import Repeat

APP = textwrap.dedent("""
    from celery import Celery

    app = Celery("ovcli", broker="memory://")
    app.conf.update(result_backend=None)


    @app.task(name="long_job")
    def long_job():
        return None
""")


def test_add_with_the_celery_app_takes_overlap_replace(
    tmp_path: Path, redis_url: str, repeat: Repeat
) -> None:
    module = f"ov_celery_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url]
    command += ["--prefix", repeat.prefix, "add", "q", "n", "--task", "long_job"]
    done = subprocess.run(
        [*command, "--every", "3s", "--overlap", "replace", "--celery", f"{module}:app"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # checked against the app: no note
    registration = repeat.get("q", "n")
    assert registration is not None and registration.definition.overlap == "replace"
