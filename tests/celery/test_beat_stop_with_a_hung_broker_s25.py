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
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.dispatch import ListPushDispatcher
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.pump import STOP_DEADLINE_S

pytestmark = [pytest.mark.timeout(180)]

DUE = 300
HOUR = 3_600_000

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
            deadline = time.monotonic() + 60
            while "beat: Starting" not in log.read_text(errors="replace"):
                assert beat.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, "the beat did not start in 60 s"
                time.sleep(0.02)
            os.kill(broker.process.pid, signal.SIGSTOP)  # the broker hangs
            try:
                definition = define(every="1h", template={"task": "hb.noop"})
                now = repeat.server_time_ms()
                repeat.upsert_many(
                    [(queue, f"r{i:04d}", definition) for i in range(DUE)], now_ms=now - HOUR
                )
                deadline = time.monotonic() + 30  # the beat wakes, claims, and its send blocks
                while not repeat.leases(queue) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert repeat.leases(queue), log.read_text(errors="replace")
                time.sleep(0.5)
                beat.send_signal(signal.SIGTERM)
                stopping = time.monotonic()
                code = beat.wait(timeout=60)
                took_s = time.monotonic() - stopping
            finally:
                os.kill(broker.process.pid, signal.SIGCONT)
        finally:
            if beat.poll() is None:
                beat.kill()
                beat.wait()
    output = log.read_text(errors="replace")
    assert code == 0, output
    assert took_s < STOP_DEADLINE_S + 3, f"the beat took {took_s:.1f}s to stop"
    assert "did not end within" in output, output[-2000:]
    now = repeat.server_time_ms()
    assert [lease for lease in repeat.leases(queue) if lease[2] > now] == []
    rescued = Pump(repeat, [queue], ListPushDispatcher(client, f"{prefix}:rescued")).run_once()
    assert any(o.redelivered for o in rescued.dispatched), "nothing was handed back"
    assert repeat.leases(queue) == []
    assert sum(r.fired for r in repeat.list(queue)) == DUE
