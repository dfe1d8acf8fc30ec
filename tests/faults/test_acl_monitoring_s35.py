"""What users confined by an ACL can run, as docs/guarantees.md's ACL section says (found by
a probe of tenants sharing one Redis, session 35).

A monitoring user with read-only keys lists, shows and reads histories (plain reads); `health`
and `export` read through scripts, which an ACL checks as writes, and are refused with the
command named. A user refused INFO (the documented `-@dangerous`) got "no live pump" from an
unhealthy `health` on a server out of memory, with `out_of_memory: false`: whether the server
is out of memory could not be read, and the line and the JSON now say so (null). A real
server with real ACL users.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

PREFIX = "acl"


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as running:
        admin = redis.Redis.from_url(running.url)
        for user, rules in (
            ("mon", ["resetchannels", f"%R~{PREFIX}:*", "+@read", "+time"]),
            ("tenant", ["resetchannels", f"~{PREFIX}:*", f"&{PREFIX}:*", "+@all", "-@dangerous"]),
        ):
            admin.execute_command("ACL", "SETUSER", user, "on", ">pw", *rules)
        Repeat(admin, PREFIX).upsert("q", "job", every="1h", template={"task": "t"})
        admin.close()
        yield running


def cli(server: EmbeddedServer, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    url = f"redis://{user}:pw@127.0.0.1:{server.port}/0"
    return subprocess.run(
        [sys.executable, "-m", "emq_bridge", "--redis-url", url, "--prefix", PREFIX, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [["list"], ["show", "q", "job"], ["history", "q", "job"], ["next", "q", "job"], ["pumps"]],
)
def test_a_monitoring_user_with_read_only_keys_reads_schedules(
    server: EmbeddedServer, argv: list[str]
) -> None:
    done = cli(server, "mon", *argv)
    assert done.returncode == 0, done.stderr
    assert "refused" not in done.stderr and "Error" not in done.stderr, done.stderr


@pytest.mark.parametrize("argv", [["health"], ["export"]])
def test_health_and_export_need_the_script_permissions_a_pump_has(
    server: EmbeddedServer, argv: list[str]
) -> None:
    done = cli(server, "mon", *argv)
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert "refused" in line and "'evalsha'" in line


def test_health_as_a_user_refused_info_says_memory_could_not_be_read(
    server: EmbeddedServer,
) -> None:
    done = cli(server, "tenant", "health", "--json")
    assert done.returncode == 4  # no pump: unhealthy, which this user's INFO cannot explain
    found = json.loads(done.stdout)
    assert found["out_of_memory"] is None and found["eviction_policy"] is None
    assert found["reason"].startswith("no live pump serves queue 'q'")
    assert found["reason"].endswith(
        "(whether Redis is out of memory, which would refuse the pumps' heartbeats, could "
        "not be read: this user may not run INFO)"
    )


def test_a_user_named_as_its_prefix_leaves_the_prefix_readable_in_errors(
    server: EmbeddedServer,
) -> None:
    # `redis://acl@host` (no password): the user part may hold a password, so it is blanked
    # out of messages, and so was the prefix of the same name: "(prefix '***')".
    url = f"redis://{PREFIX}@127.0.0.1:{server.port}/0"
    done = subprocess.run(
        [sys.executable, "-m", "emq_bridge", "--redis-url", url, "--prefix", PREFIX, "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert f"redis://***@127.0.0.1:{server.port}/0 (prefix '{PREFIX}')" in line, line
