"""Metrics in a real Celery prefork worker: the pool processes' outcome counters add up.

The worker runs with `PROMETHEUS_MULTIPROC_DIR` set, as prometheus_client's multiprocess
mode asks: the app module calls `install_outcomes()` before the pool forks, each pool
process writes its own files, and the main process serves their sum (`serve`, on
`worker_init`). The occurrences are sent by `emq-bridge pump --celery`, whose own
endpoint (`--metrics-port`, in multiprocess mode too) counts what it dispatched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis
from quiet import quiet_offset, quiet_zone

from emq_bridge import Repeat

from .scrape import free_port, sample, scrape, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RUNS = 12

APP = textwrap.dedent("""
    import os, time
    import redis
    from celery import Celery, signals
    import emq_bridge.celery  # the worker reports outcomes in every process that imports it
    from emq_bridge.metrics import install_outcomes, serve

    env = os.environ
    app = Celery("mapp", broker=env["M_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["M_BROKER"],
        emq_bridge_prefix=env["M_PREFIX"],
        task_default_queue=env["M_QUEUE"],
        # A zone where Celery's celery.backend_cleanup (04:00) is far from now: it would run too.
        timezone=env["M_TZ"],
        result_backend=None,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        beat_max_loop_interval=0.2,
    )
    app.conf.beat_schedule = {  # triggered only: their hourly slot is far from now
        f"w{i}": {"task": "mapp.work", "schedule": 3600.0, "offset": env["M_OFFSET"]}
        for i in range(int(env["M_RUNS"]))
    }
    install_outcomes()  # inherited by the pool processes
    notes = redis.Redis.from_url(env["M_BROKER"])


    @signals.worker_init.connect
    def serve_metrics(**_):
        serve(int(env["M_PORT"]))


    @app.task(name="mapp.work")
    def work():
        time.sleep(0.3)
        notes.rpush(env["M_PREFIX"] + ":pids", os.getpid())
""")


def test_outcome_counters_of_three_prefork_processes_add_up_on_one_scrape(
    tmp_path: Path, redis_url: str
) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}-q"
    (tmp_path / "mapp.py").write_text(APP)
    (tmp_path / "prom").mkdir()
    worker_port, pump_port = free_port(), free_port()
    base = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")
    }
    base.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), base.get("PYTHONPATH")])),
        M_BROKER=redis_url,
        M_PREFIX=prefix,
        M_QUEUE=queue,
        M_RUNS=str(RUNS),
        M_PORT=str(worker_port),
        M_OFFSET=quiet_offset(),
        M_TZ=quiet_zone(4),
    )
    worker_env = {**base, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    # The pump too: its endpoint then adds up its directory's files.
    pump_env = {**base, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom-pump")}
    (tmp_path / "prom-pump").mkdir()
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("worker", "pump")}
    argv = [sys.executable, "-m", "celery", "-A", "mapp", "worker", "-P", "prefork", "-c", "3"]
    argv += ["-Q", queue, "--without-mingle", "--without-gossip", "-l", "info"]
    procs = [
        subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=worker_env,
            stdout=logs["worker"],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
        subprocess.Popen(
            [
                *(sys.executable, "-m", "emq_bridge", "pump", "--celery", "mapp"),
                *("--metrics-port", str(pump_port), "--max-sleep", "0.2"),
            ],
            cwd=tmp_path,
            env=pump_env,
            stdout=logs["pump"],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
    ]
    worker_url = f"http://127.0.0.1:{worker_port}/metrics"
    pump_url = f"http://127.0.0.1:{pump_port}/metrics"
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    try:
        registered = lambda s: (  # noqa: E731
            # The beat_schedule, and Celery's own backend_cleanup, as Celery's beat installs it.
            sample(s, "emq_bridge_registrations", queue=queue, state="active") == RUNS + 1
        )
        wait_for(lambda: scrape(pump_url), registered, 30)  # synced and serving
        wait_for(lambda: scrape(worker_url), lambda s: True, 30)  # the worker is up
        for i in range(RUNS):
            repeat.trigger(queue, f"w{i}")
        done = lambda s: (  # noqa: E731
            sample(s, "emq_bridge_outcomes_total", queue=queue, status="succeeded") >= RUNS
        )
        samples = wait_for(lambda: scrape(worker_url), done, 30)
        pumped = scrape(pump_url)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for out in logs.values():
            out.close()
        repeat.close()
    output = (tmp_path / "worker.log").read_text(errors="replace")
    pids = {int(p) for p in redis.Redis.from_url(redis_url).lrange(f"{prefix}:pids", 0, -1)}
    assert len(pids) >= 2, output[-3000:]  # the runs spread over the pool
    assert sample(samples, "emq_bridge_outcomes_total", queue=queue, status="succeeded") == RUNS
    assert sample(samples, "emq_bridge_outcomes_total", queue=queue, status="started") == RUNS
    assert sample(samples, "emq_bridge_run_lag_seconds_count", queue=queue) == RUNS
    assert sample(samples, "emq_bridge_run_lag_seconds_bucket", queue=queue, le="10.0") == RUNS
    # Only the pump's endpoint has pump metrics: a worker's would say its pump never ticked.
    assert ("emq_bridge_pump_last_tick_timestamp_seconds", ()) not in samples
    assert sample(pumped, "emq_bridge_occurrences_dispatched_total", queue=queue) == RUNS
    assert sample(pumped, "emq_bridge_dispatch_lag_seconds_count", queue=queue) == RUNS
