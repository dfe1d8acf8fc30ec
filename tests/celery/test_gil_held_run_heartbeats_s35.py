"""A prefork pool process whose task holds the GIL keeps its run in flight: the worker's main
process heartbeats its pool processes' runs (found by a probe of Celery's pools, session 35).

A task that holds the GIL for longer than `3 * emq_bridge_heartbeat_s` (one long C call: a
`sum` over a big range, a regular expression that backtracks, a library that does not let
the GIL go) starved its own process's reporter thread: the run was marked lost while it ran,
the `skip` schedule's next slot was sent, and another pool process ran it beside the first.
A real prefork worker of two processes on a real Redis broker; the task holds the GIL for
5 s through a C call (`usleep` called through `ctypes.PyDLL`, which keeps the GIL).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from celery import Celery
from processes import stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HEARTBEAT_S = 1.0
HOLD_S = 5.0

APP = textwrap.dedent("""
    import ctypes
    import os
    import time

    from celery import Celery

    env = os.environ
    app = Celery("gil", broker=env["GIL_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["GIL_BROKER"],
        emq_bridge_prefix=env["GIL_PREFIX"],
        emq_bridge_heartbeat_s=float(env["GIL_HEARTBEAT_S"]),
        task_default_queue=env["GIL_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        imports=["emq_bridge.celery"],
    )
    _libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL for its whole length


    @app.task(name="gil.hold", bind=True)
    def hold(self):
        with open(env["GIL_RUNS"], "a") as runs:
            runs.write(f"start {time.time()} {self.request.id}\\n")
        _libc.usleep(int(float(env["GIL_HOLD_S"]) * 1_000_000))
        with open(env["GIL_RUNS"], "a") as runs:
            runs.write(f"end {time.time()} {self.request.id}\\n")
""")


def test_a_run_holding_the_gil_is_not_lost_and_its_skip_schedule_never_overlaps(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "gil_app.py").write_text(APP)
    runs = tmp_path / "runs.log"
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "GIL_BROKER": redis_url,
        "GIL_PREFIX": prefix,
        "GIL_QUEUE": queue,
        "GIL_HEARTBEAT_S": str(HEARTBEAT_S),
        "GIL_HOLD_S": str(HOLD_S),
        "GIL_RUNS": str(runs),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "gil_app", "worker", "-Q", queue),
                *("-c", "2", "-P", "prefork", "-l", "info", "--without-mingle"),
                "--without-gossip",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    sender = Celery("gil-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    pump = Pump(repeat, [queue], CeleryDispatcher(sender))
    try:
        wait_until(
            lambda: "ready." in log.read_text(errors="replace"),
            60,
            "the worker ready",
            then=lambda: log.read_text(errors="replace")[-3000:],
        )
        repeat.register(queue, "crunch", every="1s", overlap="skip", template={"task": "gil.hold"})
        # Two runs of 5 s, one after the other, and the slots of the first 3 s past the
        # heartbeats' bound: a run marked lost would let the next slot start beside it.
        until = time.monotonic() + 2 * HOLD_S + 4
        while time.monotonic() < until:
            pump.run_once()
            time.sleep(0.2)

        def ended() -> bool:
            pump.run_once()
            lines = runs.read_text().splitlines() if runs.exists() else []
            return sum(line.startswith("end ") for line in lines) >= 2 and not any(
                entry.status == "running" for entry in repeat.history(queue, "crunch")
            )

        wait_until(ended, 3 * HOLD_S + 10, "two runs ended and reported")
    finally:
        stop(worker)
        sender.close()
    spans: dict[str, list[float]] = {}
    for line in runs.read_text().splitlines():
        _, at, ident = line.split()
        spans.setdefault(ident, []).append(float(at))
    ordered = sorted((times[0], times[-1]) for times in spans.values())
    assert len(ordered) >= 2, ordered
    for (_, first_end), (second_start, _) in pairwise(ordered):
        assert second_start >= first_end, ordered  # one run at a time
    statuses = [entry.status for entry in repeat.history(queue, "crunch")]
    assert "lost" not in statuses, statuses
    assert statuses.count("succeeded") == len(ordered), statuses
    registration = repeat.get(queue, "crunch")
    assert registration is not None and registration.lost == 0
    assert registration.skipped > 0  # the slots that came while a run held the GIL
