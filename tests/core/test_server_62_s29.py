"""An error met inside a script reads the same on Redis 6.2 as on 7.0 and later (found by a
server-version probe).

Redis 6.2 wraps it in its own text (`Error running script (call to f_<sha>):
@user_script:<line>: <reply>`), which redis-py reads as a plain `ResponseError`: a replica's
READONLY met by a move was a broken registry instead of an outage, and a WRONGTYPE's message
began with the script's hash. `replies.redis_errors` now reads it as 7.0's reply. The ACL
line of docs/guarantees.md is taken by 6.2 too. CI runs this file on the embedded Valkey and
on Redis 6.2 (`EMQ_REDIS_SERVER`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import RegistryError, RegistryUnavailable, ReportBatchUnavailable
from emq_bridge.lifecycle import report_of

TEMPLATE = {"task": "reports.digest"}
QUEUES = ("a", "b")
GUARANTEES = Path(__file__).parents[2] / "docs" / "guarantees.md"
# 7.0 names the script's hash, Valkey does not: `<reply> script: [<sha>, ]on @user_script:N.`
WRONGTYPE_IN_A_SCRIPT = re.compile(
    r"report q: WRONGTYPE Operation against a key holding the wrong kind of value "
    r"script: ([0-9a-f]{40}, )?on @user_script:\d+\.$"
)


@pytest.fixture
def servers() -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    """A master and its replica in sync (the same binary as the suite's servers)."""
    with EmbeddedServer(extra_args=["--repl-diskless-sync-delay", "0"]) as master:
        args = ["--replicaof", "127.0.0.1", str(master.port)]
        with EmbeddedServer(extra_args=args) as replica:
            _wait_in_sync(replica)
            yield master, replica


def _wait_in_sync(server: EmbeddedServer, timeout_s: float = 10.0) -> None:
    with redis.Redis.from_url(server.url, decode_responses=True) as admin:
        deadline = time.monotonic() + timeout_s
        while admin.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not sync with its master"
            time.sleep(0.05)


def _occurrence(queue: str, due_ms: int) -> dict[str, Any]:
    return {"id": f"{queue}-job-{due_ms}", "queue": queue, "name": "job", "due_ms": due_ms}


def test_a_move_that_writes_on_a_replica_is_an_outage(
    servers: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    _, replica = servers
    with (
        redis.Redis.from_url(replica.url) as connection,
        pytest.raises(RegistryUnavailable) as caught,
    ):
        Repeat(connection, "s29").register("q", "job", every="1h", template=TEMPLATE)

    message = str(caught.value)
    assert "Redis cannot serve it now: You can't write against a read only replica." in message
    assert "Error running script" not in message, message


def test_a_report_batch_on_a_replica_is_an_outage(
    servers: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    master, replica = servers
    with redis.Redis.from_url(master.url) as written:
        on_master = Repeat(written, "s29")
        now = on_master.server_time_ms()
        for queue in QUEUES:
            on_master.upsert(queue, "job", every="1h", template=TEMPLATE, now_ms=now)
        assert written.execute_command("WAIT", 1, 5_000) == 1  # the replica has the records
    batch = [report_of("heartbeat", _occurrence(queue, now)) for queue in QUEUES]

    with (
        redis.Redis.from_url(replica.url) as connection,
        pytest.raises(ReportBatchUnavailable) as caught,
    ):
        Repeat(connection, "s29").report(batch)

    assert caught.value.queues == QUEUES
    assert "Error running script" not in str(caught.value), caught.value


def test_a_wrongtype_inside_a_script_reads_the_servers_reply_first(
    repeat: Repeat, client: redis.Redis
) -> None:
    now = repeat.server_time_ms()
    repeat.upsert("q", "job", every="1h", template=TEMPLATE, now_ms=now - 60_000)
    client.set(repeat.keys("q").running, "not a sorted set")  # report.lua's ZADD on it fails

    with pytest.raises(RegistryError) as caught:
        repeat.report([report_of("heartbeat", _occurrence("q", now))])

    error = caught.value
    assert not isinstance(error, RegistryUnavailable)
    assert WRONGTYPE_IN_A_SCRIPT.search(str(error)), error


def test_the_acl_the_guarantees_name_is_taken_and_confines_the_user() -> None:
    """Redis 6.2 refused the line without `resetchannels` (a new user has every channel)."""
    (documented,) = re.findall(r"`(~<prefix>:\* [^`]*)`", GUARANTEES.read_text())
    rules = documented.replace("<prefix>", "s29").split()
    with EmbeddedServer() as server, redis.Redis.from_url(server.url) as admin:
        admin.execute_command("ACL", "SETUSER", "docs", "on", ">pw", *rules)
        user = redis.Redis(port=server.port, username="docs", password="pw")
        with user:
            repeat = Repeat(user, "s29")
            assert repeat.register("q", "job", every="1h", template=TEMPLATE) == "registered"
            user.publish("s29:{q}:wake", "x")  # its own wake-up channels
            for refused in (lambda: user.publish("other", "x"), lambda: user.set("other", 1)):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    refused()
