"""Metrics in real Dramatiq worker processes, served by Dramatiq's own `Prometheus` middleware.

One `dramatiq` command with 3 worker processes (3 pumps racing for every occurrence, 3
reporters): Dramatiq's middleware points prometheus_client at its multiprocess directory in
each process and serves their sum from its exposition process; emq-bridge's counters land
in the same files, so one scrape of Dramatiq's endpoint adds up every process's.
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
from quiet import quiet_offset

from emq_bridge import Repeat

from .scrape import free_port, sample, scrape, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RUNS = 12

APP = textwrap.dedent("""
    import os, time
    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware.prometheus import Prometheus
    from emq_bridge.dramatiq import RecurringMiddleware
    from emq_bridge.metrics import MetricsEvents, install_outcomes

    env = os.environ
    broker = RedisBroker(url=env["M_BROKER"], namespace=env["M_PREFIX"])
    broker.add_middleware(Prometheus())
    broker.add_middleware(
        RecurringMiddleware(
            prefix=env["M_PREFIX"],
            max_sleep_s=0.2,
            heartbeat_s=0.5,
            listeners=[MetricsEvents()],  # this process's pump
        )
    )
    install_outcomes()  # this process's reports (made lazily: after Prometheus set its dir)
    dramatiq.set_broker(broker)
    notes = redis.Redis.from_url(env["M_BROKER"])


    @dramatiq.actor(queue_name=env["M_QUEUE"])
    def work():
        time.sleep(0.3)
        notes.rpush(env["M_PREFIX"] + ":pids", os.getpid())
""")


def test_outcome_counters_of_three_worker_processes_add_up_on_dramatiqs_endpoint(
    tmp_path: Path, redis_url: str
) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}-q"
    (tmp_path / "mapp.py").write_text(APP)
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")
    }
    env.update(
        REDIS_URL=redis_url,  # RecurringMiddleware's registry
        M_BROKER=redis_url,
        M_PREFIX=prefix,
        M_QUEUE=queue,
        dramatiq_prom_db=str(tmp_path / "prom"),
        dramatiq_prom_host="127.0.0.1",
        dramatiq_prom_port=str(port),
    )
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    offset = quiet_offset()  # triggered only: a top of the hour mid-test would run each again
    for i in range(RUNS):
        repeat.register(queue, f"w{i}", every="1h", offset=offset, template={"task": "work"})
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "dramatiq", "mapp", "--path", str(tmp_path)),
            *("--processes", "3", "--threads", "1"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        # Every worker process serves its pump once it booted: then fire the runs.
        wait_for(lambda: scrape(url), lambda s: sample(s, "emq_bridge_pump_ticks_total") > 0, 30)
        for i in range(RUNS):
            repeat.trigger(queue, f"w{i}")
        done = lambda s: (  # noqa: E731
            sample(s, "emq_bridge_outcomes_total", queue=queue, status="succeeded") >= RUNS
        )
        samples = wait_for(lambda: scrape(url), done, 30)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()
    output = (tmp_path / "worker.log").read_text(errors="replace")
    pids = {int(p) for p in redis.Redis.from_url(redis_url).lrange(f"{prefix}:pids", 0, -1)}
    assert len(pids) >= 2, output[-3000:]  # several processes ran them, and reported
    assert sample(samples, "emq_bridge_outcomes_total", queue=queue, status="succeeded") == RUNS
    assert sample(samples, "emq_bridge_outcomes_total", queue=queue, status="started") == RUNS
    assert sample(samples, "emq_bridge_outcomes_total", queue=queue, status="failed") == 0
    # One first start each; triggered now, each started within seconds of its slot.
    assert sample(samples, "emq_bridge_run_lag_seconds_count", queue=queue) == RUNS
    assert sample(samples, "emq_bridge_run_lag_seconds_bucket", queue=queue, le="10.0") == RUNS
    # The three pumps raced for the triggers: each was sent once, whichever pump sent it.
    assert sample(samples, "emq_bridge_occurrences_dispatched_total", queue=queue) == RUNS
    assert sample(samples, "emq_bridge_dispatch_lag_seconds_count", queue=queue) == RUNS
    # Dramatiq's own metrics, from the same processes, in the same scrape.
    assert sample(samples, "dramatiq_messages_total", queue_name=queue, actor_name="work") == RUNS
    repeat.close()
