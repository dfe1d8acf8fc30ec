"""On `-P gevent`, a task killed by its hard time limit is reported `failed` with
`TimeLimitExceeded`, and its `skip` schedule goes on (probe: worker pools, session 31).

There the time limit is a `gevent.Timeout` raised inside the task: it leaves the task through
`task_postrun` with no state, then `Request.on_timeout` sends `task_failure` with no request
pushed, so the receivers saw neither as a report. The run stayed `running`, heartbeated by
its worker as long as that lived, and every later slot of its `skip` schedule was skipped:
one run in 25 s. Now the run's start is kept aside by task id between the two signals
(`emq_bridge.celery.reporting._escaped`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis
from needs import require
from processes import stop, wait_until

from emq_bridge import Repeat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

APP = textwrap.dedent("""
    import os
    import time

    from celery import Celery

    import emq_bridge.celery  # its signal receivers report what the worker runs

    env = os.environ
    app = Celery("gtapp", broker=env["GT_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["GT_BROKER"],
        emq_bridge_prefix=env["GT_PREFIX"],
        emq_bridge_heartbeat_s=0.5,
        task_default_queue=env["GT_QUEUE"],
        beat_max_loop_interval=0.5,
        result_backend=None,
        broker_connection_retry_on_startup=True,
        beat_schedule={
            "limited": {"task": "gt.limited", "schedule": 1.0, "overlap": "skip"},
        },
    )


    @app.task(name="gt.limited", time_limit=1)
    def limited():
        time.sleep(4)  # gevent's sleep, once the worker patched it: the time limit ends it
""")


def test_a_hard_time_limit_on_gevent_is_a_failure_and_the_skip_schedule_goes_on(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    require(importlib.util.find_spec("gevent"), "gevent is not installed (the test extra has it)")
    (tmp_path / "gtapp.py").write_text(APP)
    queue = f"{prefix}-q"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
        GT_BROKER=redis_url,
        GT_PREFIX=prefix,
        GT_QUEUE=queue,
    )
    worker_argv = [sys.executable, "-m", "celery", "-A", "gtapp", "worker", "-P", "gevent"]
    worker_argv += ["-c", "5", "-Q", queue, "-l", "info"]
    worker_argv += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    beat_argv = [sys.executable, "-m", "celery", "-A", "gtapp", "beat", "-l", "info"]
    beat_argv += ["--pidfile=", "-S", "emq_bridge.celery:RepeatScheduler"]
    repeat = Repeat(client, prefix)
    logs = {name: tmp_path / f"{name}.log" for name in ("worker", "beat")}
    processes = []
    for argv, log in ((worker_argv, logs["worker"]), (beat_argv, logs["beat"])):
        with log.open("wb") as out:
            processes.append(
                subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
            )

    def said() -> str:
        tails = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs.values())
        return f"history: {repeat.history(queue, 'limited')}\n{tails}"

    def failed() -> list[str]:
        return [e.error for e in repeat.history(queue, "limited") if e.status == "failed"]

    try:
        wait_until(lambda: len(failed()) >= 3, 90, "three runs ended by the limit", then=said)
    finally:
        for process in processes:
            stop(process)
    assert all(error.startswith("TimeLimitExceeded") for error in failed()), said()
    record = repeat.get(queue, "limited")
    assert record is not None and record.fired >= 3, said()
    # No run was left in flight by the limit: only the last one sent may still be.
    running = [e for e in repeat.history(queue, "limited") if e.status == "running"]
    assert len(running) <= 1, said()
