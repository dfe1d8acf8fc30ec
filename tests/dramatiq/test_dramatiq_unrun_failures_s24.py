"""A rolling deploy that adds a schedule on a new actor: the old workers' consumers, which
fail its messages unrun (`ActorNotFound`, dead-lettered), no longer pause it.

Before, each such message was reported `failed` and counted toward `pause_after_failures`:
`@recurring(every=..., pause_after_failures=2)` on an actor the new version adds paused itself
after two slots an old worker took, and stayed paused once the deploy ended. Now each is
still `failed` in the history, naming the cause, but its task never ran, so it neither
counts toward the streak nor ends one.

Real processes, on the suite's server under a per-test prefix (`Deploy` of the rolling
rename test, with this app):

* version 1 (`generation=1`), a `dramatiq` worker: declares `old_job` only;
* version 2 (`generation=2`), only its `emq-bridge pump --dramatiq` runs: it declares the
  actor `renamed_new` on the same queue, with a 1 s schedule and `pause_after_failures=2`.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import wait_until
from test_dramatiq_rolling_rename import Deploy

pytestmark = [pytest.mark.timeout(120)]

APP = """
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring

env = os.environ
VERSION = int(env["OWN_VERSION"])
broker = RedisBroker(url=env["REDIS_URL"], namespace=env["OWN_NAMESPACE"])
broker.add_middleware(
    RecurringMiddleware(
        prefix=env["OWN_PREFIX"], source="dep", generation=VERSION, lease_ms=2000, max_sleep_s=0.2
    )
)
dramatiq.set_broker(broker)
QUEUE = env["OWN_QUEUE"]


@dramatiq.actor(queue_name=QUEUE)
def old_job():
    pass


if VERSION >= 2:
    @recurring(every="1s", pause_after_failures=2)
    @dramatiq.actor(queue_name=QUEUE)
    def renamed_new():
        pass
"""

UNKNOWN = "ActorNotFound: 'renamed_new' is not an actor of this worker"


@pytest.fixture
def deploy(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Deploy]:
    deploy = Deploy(tmp_path, redis_url, prefix)
    (tmp_path / f"{deploy.module}.py").write_text(APP)  # this test's app, in its module
    try:
        yield deploy
    finally:
        deploy.close()


def start_pump(deploy: Deploy, version: str) -> None:
    """`emq-bridge pump --dramatiq` of the app in `version` (stopped by `deploy.close`)."""
    log = deploy.root / f"pump-v{version}-{uuid.uuid4().hex[:8]}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "emq_bridge", "pump", "--dramatiq", f"{deploy.module}:broker"],
            env={**deploy.env, "OWN_VERSION": version},
            cwd=deploy.root,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deploy.running.append(process)
    deploy.logs.append(log)


def test_an_old_workers_unrun_failures_of_a_new_actor_never_pause_its_schedule(
    deploy: Deploy,
) -> None:
    deploy.start("1")  # the old worker: the only consumer of the queue
    start_pump(deploy, "2")  # the new version's deploy step: syncs generation 2, pumps

    def logs() -> str:
        return "\n".join(log.read_text(errors="replace")[-2000:] for log in deploy.logs)

    def failed() -> list[str | None]:
        return [
            e.error
            for e in deploy.repeat.history(deploy.queue, "renamed_new")
            if e.status == "failed"
        ]

    def paused() -> bool:
        registration = deploy.repeat.get(deploy.queue, "renamed_new")
        return registration is not None and registration.paused

    wait_until(
        lambda: len(failed()) >= 3 or paused(), 60, "3 slots the old worker failed", then=logs
    )
    registration = deploy.repeat.get(deploy.queue, "renamed_new")
    assert registration is not None
    assert not registration.paused and registration.parked_reason is None, registration
    assert registration.failures == 0
    assert (registration.last_status, registration.last_error) == ("failed", UNKNOWN)
    assert failed()[:3] == [UNKNOWN] * 3
    assert registration.definition.pause_after_failures == 2
    # Dramatiq's own handling of it: the old worker dead-lettered the messages, unrun.
    old_log = deploy.logs[0].read_text(errors="replace")
    assert "Received message for undefined actor 'renamed_new'" in old_log, old_log[-3000:]
