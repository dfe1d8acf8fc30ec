"""`emq-bridge add --dramatiq SPEC` as a process, on a real Dramatiq app module: what the
tests of its checks share."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import redis

APP = textwrap.dedent("""
    import os

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware

    broker = RedisBroker(url=os.environ["OV_REDIS"], namespace=os.environ["OV_NAMESPACE"])
    broker.add_middleware(RecurringMiddleware(prefix=os.environ["OV_PREFIX"]))
    dramatiq.set_broker(broker)


    @dramatiq.actor(queue_name="q", actor_name="long_job")
    def long_job():
        pass
""")


def add(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    *args: str,
    queue: str = "q",
    named_registry: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `emq-bridge add` with the app; `named_registry=False` names none (no --redis-url,
    --prefix nor $REDIS_URL): the app's own is then the one written to."""
    module = f"ov_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP)
    env = {
        **{k: v for k, v in os.environ.items() if named_registry or k != "REDIS_URL"},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "OV_REDIS": redis_url,
        "OV_PREFIX": prefix,
        "OV_NAMESPACE": f"ov{uuid.uuid4().hex[:8]}",
    }
    command = [sys.executable, "-m", "emq_bridge"]
    if named_registry:
        command += ["--redis-url", redis_url, "--prefix", prefix]
    command += ["add", queue, "n", "--task", "long_job", "--every", "3s", *args]
    return subprocess.run(
        [*command, "--dramatiq", f"{module}:broker"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:*", count=1000))
