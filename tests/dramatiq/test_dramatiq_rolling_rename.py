"""A rolling deploy without generations that renames a schedule's actor: the old workers'
pumps, which cannot send the new actor, leave its occurrences to the new workers instead of
parking the schedule (which then stayed stopped once every worker ran the new version).

Real `dramatiq` worker processes of a generated app in two versions, both pumping one
queue, against the suite's server under a per-test prefix:

* version 1: schedule `tick` every 1 s runs actor `tick_v1`;
* version 2: the same schedule runs actor `tick_v2`, which version 1 does not declare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from processes import stop, wait_until

from emq_bridge import Repeat

pytestmark = [pytest.mark.timeout(120)]

APP = """
import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring

env = os.environ
VERSION = env["OWN_VERSION"]
broker = RedisBroker(url=env["REDIS_URL"], namespace=env["OWN_NAMESPACE"])
broker.add_middleware(
    RecurringMiddleware(prefix=env["OWN_PREFIX"], source="own", lease_ms=2000, max_sleep_s=0.2)
)
dramatiq.set_broker(broker)
QUEUE = env["OWN_QUEUE"]
RUNS = redis.Redis.from_url(env["REDIS_URL"])


def ran():
    RUNS.rpush(env["OWN_RUNS"], VERSION)


if VERSION == "1":
    @recurring(every="1s", name="tick")
    @dramatiq.actor(queue_name=QUEUE)
    def tick_v1():
        ran()
else:
    @recurring(every="1s", name="tick")
    @dramatiq.actor(queue_name=QUEUE)
    def tick_v2():
        ran()
"""


class Deploy:
    """`dramatiq` commands running the app in either version, one worker process each."""

    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        token = uuid.uuid4().hex[:10]
        self.root = root
        self.module = f"emq_rename_app_{token}"
        self.queue = f"q{token}"
        self.runs_key = f"{prefix}:runs"
        self.client = redis.Redis.from_url(redis_url)
        self.repeat = Repeat(self.client, prefix)
        (root / f"{self.module}.py").write_text(APP)
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "OWN_PREFIX": prefix,
            "OWN_NAMESPACE": f"dq{token}",
            "OWN_QUEUE": self.queue,
            "OWN_RUNS": self.runs_key,
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        }
        self.running: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, version: str) -> subprocess.Popen[bytes]:
        """Start a worker of `version`; return once its pump runs."""
        log = self.root / f"v{version}-{uuid.uuid4().hex[:8]}.log"
        command = [sys.executable, "-m", "dramatiq", self.module, "--path", str(self.root)]
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [*command, "--processes", "1", "--threads", "1"],
                env={**self.env, "OWN_VERSION": version},
                cwd=self.root,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        self.running.append(process)
        self.logs.append(log)
        wait_until(
            lambda: "pump started in the worker" in log.read_text(errors="replace"),
            30,
            f"the pump of version {version}",
        )
        return process

    def runs(self) -> list[str]:
        return [v.decode() for v in self.client.lrange(self.runs_key, 0, -1)]

    def close(self) -> None:
        for process in self.running:
            stop(process)
        self.client.delete(self.runs_key)
        self.repeat.close()


@pytest.fixture
def deploy(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Deploy]:
    deploy = Deploy(tmp_path, redis_url, prefix)
    try:
        yield deploy
    finally:
        deploy.close()


def test_an_old_worker_leaves_a_renamed_actors_schedule_to_the_new_one_without_parking(
    deploy: Deploy,
) -> None:
    old = deploy.start("1")
    wait_until(lambda: "1" in deploy.runs(), 20, "a run of version 1")
    deploy.start("2")  # its boot rewrites `tick` for tick_v2
    # Both pumps serve the queue for a while: the old one claims some of the slots, and
    # cannot send them (the actor tick_v2 is not its broker's).
    wait_until(
        lambda: "tick_v2" in deploy.logs[0].read_text(errors="replace"), 30, "an old pump's try"
    )
    # Its first try may race the new boot's rewrite (the template changed since its read: not
    # parked either, tried again after the lease); a later slot it claims says why it leaves it.
    wait_until(
        lambda: (
            "not parked: newer code of its source is live"
            in deploy.logs[0].read_text(errors="replace")
        ),
        30,
        "the old pump leaving a slot to the new one",
    )
    stop(old)  # the deploy ends: every worker runs version 2
    tick = deploy.repeat.get(deploy.queue, "tick")
    assert tick is not None and tick.parked_reason is None and not tick.paused
    count = deploy.runs().count("2")
    wait_until(lambda: deploy.runs().count("2") >= count + 3, 20, "version 2 running tick")
    old_log = deploy.logs[0].read_text(errors="replace")
    assert "not parked: newer code of its source is live" in old_log
    assert "parked" not in deploy.logs[1].read_text(errors="replace")
