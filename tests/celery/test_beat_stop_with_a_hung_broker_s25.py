"""SIGTERM to a real `celery beat -S emq` while its broker hangs (found by a probe).

The beat holds SIGTERM while a tick runs, so the batch in hand is settled before Celery's
handler exits. A send blocked on a broker that hangs (its process stopped, so the
connection neither answers nor resets) never ended the tick: the beat stayed up until its
broker came back, or until Kubernetes killed it, its claimed batch left to wait out the
lease. Now the held signal is handed on `STOP_DEADLINE_S` after it came: Celery's
`SystemExit` interrupts the send, the pump hands the batch back, and the next pump sends it
at once, same ids, marked redelivered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis
from hung_broker import assert_handed_back, stop_while_hung
from processes import wait_until

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.pump import STOP_DEADLINE_S

pytestmark = [pytest.mark.timeout(180)]

DUE = 300

APP = textwrap.dedent("""
    import os

    from celery import Celery

    env = os.environ
    app = Celery("hungbeat", broker=env["HB_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["HB_REDIS"],
        emq_bridge_prefix=env["HB_PREFIX"],
        task_default_queue=env["HB_QUEUE"],
        beat_schedule={},
        result_backend=None,
        result_expires=None,
    )
""")


def test_sigterm_to_a_beat_whose_broker_hangs_exits_and_hands_the_batch_back(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"{prefix}-hung"
    repeat = Repeat(client, prefix)
    (tmp_path / "hb_app.py").write_text(APP)
    log = tmp_path / "beat.log"
    with EmbeddedServer() as broker:
        assert broker.process is not None
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
            "HB_BROKER": broker.url,
            "HB_REDIS": redis_url,
            "HB_PREFIX": prefix,
            "HB_QUEUE": queue,
        }
        with log.open("wb") as out:
            beat = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "hb_app", "beat", "-S", "emq"),
                    *("--pidfile=", f"--schedule={tmp_path / 'beat.db'}", "-l", "info"),
                ],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:

            def started() -> bool:
                assert beat.poll() is None, log.read_text(errors="replace")
                return "beat: Starting" in log.read_text(errors="replace")

            wait_until(started, 60, "the beat's start")
            took_s = stop_while_hung(
                repeat, broker, beat, queue, "hb.noop", DUE, then=log.read_text
            )
            code = beat.returncode
        finally:
            if beat.poll() is None:
                beat.kill()
                beat.wait()
    output = log.read_text(errors="replace")
    assert code == 0, output
    assert took_s < STOP_DEADLINE_S + 3, f"the beat took {took_s:.1f}s to stop"
    assert "did not end within" in output, output[-2000:]
    assert_handed_back(repeat, client, prefix, queue, DUE)
