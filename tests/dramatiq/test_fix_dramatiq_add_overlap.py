"""`emq-bridge add --dramatiq SPEC --overlap replace` is refused, as the adapter's own
declarations refuse it (`recurring`, `register`, the middleware's file check): Dramatiq
cannot revoke a message that runs. A real app module, a real `emq-bridge` process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis
from add_cli import add, keys

from emq_bridge import Repeat


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
