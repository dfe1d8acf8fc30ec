"""`emq-bridge demo` on a server whose user is confined to its prefix (session 35's "left
alone": found by the ACL probe).

The demo writes under a throwaway `emq-demo-<random>` prefix, not the registry's, and the
documented ACL (`~<prefix>:*`) refuses it: the demo's Dramatiq worker failed at boot with a
CRITICAL log line and Redis's bare "No permissions to access a key", exit 1. It now says in
one line what the user needs, exit 3 (Redis refusing a command), before starting anything,
and leaves no key behind. A user allowed the demo's keys still runs it. A real server.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from emq_bridge.embedded import EmbeddedServer


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as running:
        admin = redis.Redis.from_url(running.url)
        for user, keys in (("tenant", "emq:"), ("demo", "emq-demo-")):
            rules = ["resetchannels", f"~{keys}*", f"&{keys}*", "+@all", "-@dangerous"]
            admin.execute_command("ACL", "SETUSER", user, "on", ">pw", *rules)
        admin.close()
        yield running


def demo(server: EmbeddedServer, user: str) -> subprocess.CompletedProcess[str]:
    url = f"redis://{user}:pw@127.0.0.1:{server.port}/0"
    return subprocess.run(
        [sys.executable, "-m", "emq_bridge", "--redis-url", url, "demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_user_confined_to_its_prefix_is_told_what_the_demo_needs(
    server: EmbeddedServer,
) -> None:
    done = demo(server, "tenant")
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("Error: the demo writes its keys and channels under emq-demo-"), line
    assert "~emq-demo-* and &emq-demo-*" in line and "pw" not in line, line
    assert done.stdout == ""  # nothing started
    assert redis.Redis.from_url(server.url).dbsize() == 0


def test_a_user_allowed_the_demos_keys_runs_it(server: EmbeddedServer) -> None:
    done = demo(server, "demo")
    assert done.returncode == 0, done.stderr
    assert "Summary after" in done.stdout
    assert redis.Redis.from_url(server.url).dbsize() == 0
