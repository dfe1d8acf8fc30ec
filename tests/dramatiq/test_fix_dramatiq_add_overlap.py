"""`emq-bridge add --dramatiq SPEC --overlap replace` is refused, as the adapter's own
declarations refuse it (`recurring`, `register`, the middleware's file check): Dramatiq
cannot revoke a message that runs. A real app module, a real `emq-bridge` process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import redis

from emq_bridge import Repeat

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


def test_add_with_the_dramatiq_app_refuses_overlap_replace_with_one_line_and_writes_nothing(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    refused = add(tmp_path, redis_url, prefix, "--overlap", "replace")
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("Error: --overlap replace is not available on Dramatiq")
    assert "nothing written" in line
    assert refused.stdout == ""
    assert keys(client, prefix) == []


def test_add_with_the_dramatiq_app_takes_the_policies_dramatiq_can_honour(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    added = add(tmp_path, redis_url, prefix, "--overlap", "skip")
    assert added.returncode == 0, added.stderr
    registration = Repeat(client, prefix).get("q", "n")
    assert registration is not None and registration.definition.overlap == "skip"


def test_add_with_the_dramatiq_app_refuses_a_queue_its_actor_does_not_consume(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    # Before: accepted, while the same schedule in a file stops the workers' boot; no worker
    # of the actor pumps that queue.
    refused = add(tmp_path, redis_url, prefix, queue="elsewhere")
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "actor 'long_job' consumes queue 'q', not 'elsewhere'" in line, line
    assert "nothing written" in line
    assert keys(client, prefix) == []


def test_add_without_an_app_still_takes_replace(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    """Without --dramatiq the framework is unknown: Celery can revoke, so replace stands."""
    command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    done = subprocess.run(
        [*command, "add", "q", "n", "--task", "t", "--every", "3s", "--overlap", "replace"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    registration = Repeat(client, prefix).get("q", "n")
    assert registration is not None and registration.definition.overlap == "replace"


def test_add_with_the_app_writes_to_the_apps_registry_when_none_is_named(
    tmp_path: Path, redis_url: str, client: redis.Redis, prefix: str
) -> None:
    # Before: the schedule checked against the app went to the default registry (REDIS_URL
    # unset: redis://127.0.0.1:6379/0, prefix emq), which none of the app's pumps reads.
    done = add(tmp_path, redis_url, prefix, named_registry=False)
    assert done.returncode == 0, done.stderr
    registration = Repeat(client, prefix).get("q", "n")  # the middleware's registry and prefix
    assert registration is not None and registration.definition.template["task"] == "long_job"
