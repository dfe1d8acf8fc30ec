"""SIGTERM to `emq-bridge pump` while its broker hangs (found by a probe).

A send blocked on a broker that hangs (here: its process stopped with SIGSTOP, so the
connection neither answers nor resets) never saw the stop: the pump stayed up until its
broker came back, or until Kubernetes killed it, and its claimed batch waited out the lease.
Now the stop interrupts the send `STOP_DEADLINE_S` after the signal: what was sent is acked,
the rest (the hung send included) is handed back, and the next pump sends it at once, same
ids, marked redelivered. Both send paths: a batch publish (Celery on a Redis broker) and one
occurrence at a time (Dramatiq with `pipelined=False`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO

import pytest
import redis
from hung_broker import assert_handed_back, stop_while_hung
from processes import wait_until

from emq_bridge import Repeat
from emq_bridge.cli.stopping import STOP_DEADLINE_S
from emq_bridge.embedded import EmbeddedServer

QUEUE = "hung"
DUE = 300

CELERY_APP = """
from celery import Celery
app = Celery("hung", broker={broker!r})
app.conf.update(
    result_backend=None, emq_bridge_redis_url={registry!r}, emq_bridge_prefix={prefix!r}
)

@app.task(name="t")
def t():
    pass
"""

DRAMATIQ_APP = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker
from emq_bridge.dramatiq import RecurringMiddleware

broker = RedisBroker(url={broker!r})
broker.add_middleware(RecurringMiddleware(
    {registry!r}, prefix={prefix!r}, pipelined=False, run_pump=False, sync_at_boot=False
))
dramatiq.set_broker(broker)

@dramatiq.actor(actor_name="t", queue_name={queue!r})
def t():
    pass
"""


def _lines_of(stream: IO[str]) -> list[str]:
    """The lines `stream` gives, as they come (a thread reads them)."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(stream), daemon=True).start()
    return lines


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_sigterm_while_the_broker_hangs_stops_the_pump_and_hands_the_batch_back(
    framework: str, tmp_path: Path, redis_url: str, prefix: str, repeat: Repeat, client: redis.Redis
) -> None:
    with EmbeddedServer() as broker:
        source = CELERY_APP if framework == "celery" else DRAMATIQ_APP
        module = f"hung_{framework}_{os.getpid()}"
        (tmp_path / f"{module}.py").write_text(
            source.format(broker=broker.url, registry=redis_url, prefix=prefix, queue=QUEUE)
        )
        command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url]
        command += ["--prefix", prefix, "pump", QUEUE, f"--{framework}", module]
        env = {
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }
        process = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
        )
        assert process.stderr is not None
        lines = _lines_of(process.stderr)
        try:
            wait_until(
                lambda: any(line.startswith("pumping ") for line in lines),
                60,
                "the pump's start",
                then=lambda: "".join(lines),
            )
            took_s = stop_while_hung(
                repeat, broker, process, QUEUE, "t", DUE, then=lambda: "".join(lines)
            )
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        time.sleep(0.2)  # the reader's last lines
        rest = "".join(lines)
        assert process.returncode == 0, rest
        assert took_s < STOP_DEADLINE_S + 3, f"the pump took {took_s:.1f}s to stop"
        assert "a send did not return within" in rest, rest
        assert "pump stopped" in rest
    # Every occurrence reaches a broker (the stopped one, or the next pump's list): none is
    # lost, and the next pump sends each it was handed once.
    ids = Counter(assert_handed_back(repeat, client, prefix, QUEUE, DUE))
    assert set(ids.values()) == {1}
