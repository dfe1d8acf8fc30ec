"""A `celery beat` stopped while it builds its scheduler stops that one, and boots no other.

Celery installs its SIGTERM/SIGINT handler (`Service.sync`: close the scheduler, then exit)
before the service builds its scheduler, and reads the scheduler through a cached property
that is set only once the build returns. A stop that came during the build (the boot's
sync of a large app takes seconds) built a second scheduler inside the handler: a second
boot sync, a second pump, while the first stayed open (its heartbeat left to expire). CI
caught it as an unchanged beat that logged "unchanged since its last sync" after its full
sync. Now a scheduler built while another is being built in the same thread is a stand-in:
it syncs nothing, and its `close` closes the one being built.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import wait_until

from emq_bridge import Repeat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

# The app's scheduler is emq-bridge's, with a pause after its boot sync: a boot that is
# still building the scheduler when the stop comes (a large app converting, a slow registry).
APP = textwrap.dedent("""
    import os
    import time

    from celery import Celery
    from emq_bridge.celery import RepeatScheduler

    env = os.environ
    app = Celery("slowboot", broker=env["SLOW_REDIS"])
    app.conf.update(
        emq_bridge_redis_url=env["SLOW_REDIS"],
        emq_bridge_prefix=env["SLOW_PREFIX"],
        task_default_queue=env["SLOW_QUEUE"],
        beat_schedule={"tick": {"task": "slowboot.tick", "schedule": 60.0}},
        timezone="UTC",
        result_backend=None,
        result_expires=None,
    )


    @app.task(name="slowboot.tick")
    def tick():
        return None


    class SlowBoot(RepeatScheduler):
        def setup_schedule(self):
            super().setup_schedule()
            if not self.app.conf.get("slowboot_built"):  # the first build only
                self.app.conf.slowboot_built = True
                print("booted; building on", flush=True)
                time.sleep(30)
""")


def test_a_stop_while_the_scheduler_is_built_ends_the_beat_without_a_second_boot(
    tmp_path: Path, redis_url: str, prefix: str, repeat: Repeat
) -> None:
    (tmp_path / "slowboot.py").write_text(APP)
    queue = f"{prefix}-q"
    log = tmp_path / "beat.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "SLOW_REDIS": redis_url,
        "SLOW_PREFIX": prefix,
        "SLOW_QUEUE": queue,
    }
    args = ["beat", "-S", "slowboot.SlowBoot", "--pidfile=", f"--schedule={tmp_path / 's.db'}"]
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "slowboot", *args, "-l", "info"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        booted = "booted; building on"
        wait_until(lambda: booted in log.read_text(), 30, "the boot sync", then=log.read_text)
        beat.send_signal(signal.SIGTERM)
        beat.wait(timeout=20)  # not the 30 s pause: the stop ends the build
    finally:
        if beat.poll() is None:
            beat.kill()
            beat.wait()
    output = log.read_text()
    assert output.count("schedule(s) declared") == 1, output
    assert "unchanged since" not in output, output  # no second boot in the handler
    assert repeat.get(queue, "tick") is not None  # the one boot synced it
