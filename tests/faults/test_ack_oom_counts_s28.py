"""An ack on a registry server over its `maxmemory` (noeviction: a shared Redis that other
clients filled between the send and the ack) still counts what the broker accepted.

Before: `ack.lua` counted each lease's `fired` and `last_fired_ms` before dropping the
leases; the server refuses a script's first write that may grow memory, so every count was
refused (silently: pcall) and the leases were dropped anyway: `fired` stayed 0 for
occurrences that were sent, against the guarantee that it counts what a broker accepted.
Now the leases go first (a ZREM is never refused), after which the script may write."""

from __future__ import annotations

import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
HOUR = 3_600_000
LEASE_MS = 60_000


def test_an_ack_counts_fired_when_the_server_is_out_of_memory() -> None:
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        repeat = Repeat(client, "oom")
        for name in ("a", "b"):
            repeat.register("q", name, every="1h", template={"task": "t"}, now_ms=T0)
        repeat.client.hset(repeat.keys("q").record("b"), "fired", "garbage")  # its error path
        due = T0 + HOUR
        scan = repeat.scan("q", 100, due)
        candidates = [(name, score, score + HOUR, 0, "fire") for name, score in scan.due]
        claim = repeat.claim("q", due, LEASE_MS, candidates, scan.expired)
        leases = [f"{candidates[i][0]} {candidates[i][1]}" for i in claim.claimed]
        assert len(leases) == 2
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1)
        try:
            repeat.ack("q", leases, deadline_ms=due + LEASE_MS, released_ms=due)
        finally:
            client.config_set("maxmemory", 0)
        assert repeat.leases("q") == []
        for name in ("a", "b"):
            registration = repeat.get("q", name)
            assert (registration.fired, registration.last_fired_ms) == (1, due), name
