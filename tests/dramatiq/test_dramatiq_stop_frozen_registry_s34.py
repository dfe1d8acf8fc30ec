"""A `dramatiq` worker stops within Kubernetes' grace period while its registry does not
answer (found by a probe of container deployments, session 34).

A registry Redis frozen (SIGSTOP: a partition, a stalled VM) held a SIGTERMed worker for
21 to 28 s: its middleware waited up to 10 s for the pump thread, held in Redis calls of 5 s
each, then 5 s to flush reports, then 5 s more to close; with actors still finishing,
Kubernetes' 30 s `terminationGracePeriodSeconds` ran out and the pod was killed. The pump
thread now gets what the CLI pump and `celery beat -S emq` get (`STOP_DEADLINE_S`), and the
reports half a second once Redis is known not to take them. The broker (another server)
stays healthy. Real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis
from processes import stop, wait_until

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import os

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, recurring

    env = os.environ
    broker = RedisBroker(url=env["FR_BROKER"], namespace=env["FR_NAMESPACE"])
    broker.add_middleware(
        RecurringMiddleware(repeat=env["FR_REGISTRY"], prefix="fr", source="fr", max_sleep_s=0.5)
    )
    dramatiq.set_broker(broker)


    @recurring(every="1s", name="tick", overlap="skip")
    @dramatiq.actor(queue_name="fr", actor_name="tick")
    def tick():
        pass
""")


def test_a_worker_stops_within_the_grace_period_while_its_registry_is_frozen(
    tmp_path: Path, redis_url: str
) -> None:
    module = f"fr_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP)
    with EmbeddedServer() as registry:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
            "FR_BROKER": redis_url,
            "FR_REGISTRY": registry.url,
            "FR_NAMESPACE": f"fr{uuid.uuid4().hex[:8]}",
        }
        repeat = Repeat(redis.Redis.from_url(registry.url), "fr")
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [*(sys.executable, "-m", "dramatiq", module), *("-p", "1", "-t", "2")],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        frozen = False
        try:
            fired = lambda: (r := repeat.get("fr", "tick")) is not None and r.fired >= 2  # noqa: E731
            wait_until(fired, 30, "the schedule to fire twice", then=log.read_text)
            assert registry.process is not None
            os.kill(registry.process.pid, signal.SIGSTOP)
            frozen = True
            time.sleep(1.5)
            began = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            took = time.monotonic() - began
            # Before: 21 to 28 s (21 s here). Now the pump's 3 s, a flush that meets the 5 s socket
            # timeout, half a second to close, and Dramatiq's own stop.
            assert took < 17, (took, log.read_text()[-3000:])  # (10.5 to 11.5 s here)
        finally:
            if frozen:
                os.kill(registry.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
            if worker.poll() is None:
                stop(worker)
