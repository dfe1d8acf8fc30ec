"""The ack and fetch moves at their edges: what a record gone, edited or pieced gives."""

from __future__ import annotations

import json

import pytest

from emq_bridge import Repeat
from emq_bridge.template_pieces import join_template

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000
LEASE_MS = 60_000


def claim_due(repeat: Repeat, queue: str, now_ms: int) -> list[str]:
    """Claim what is due as a pump would, without sending or acking; return the leases."""
    scan = repeat.scan(queue, 100, now_ms)
    candidates = [(name, score, score + HOUR, 0, "fire") for name, score in scan.due]
    claim = repeat.claim(queue, now_ms, LEASE_MS, candidates, scan.expired)
    return [f"{candidates[i][0]} {candidates[i][1]}" for i in claim.claimed]


def record(repeat: Repeat, queue: str, name: str) -> dict[bytes, bytes]:
    fields: dict[bytes, bytes] = repeat.client.hgetall(repeat.keys(queue).record(name))
    return fields


def test_an_ack_counts_each_lease_it_drops_once_even_when_given_twice(any_repeat: Repeat) -> None:
    repeat = any_repeat
    for name in ("a", "b"):
        repeat.register("q", name, every="1h", template={"task": "t"}, now_ms=T0)
    due = T0 + HOUR
    leases = claim_due(repeat, "q", due)
    assert sorted(leases) == [f"a {due}", f"b {due}"]
    earliest = repeat.ack(
        "q", [*leases, leases[0]], deadline_ms=due + LEASE_MS, released_ms=due + 5
    )
    assert earliest is None and repeat.leases("q") == []
    for name in ("a", "b"):
        fields = record(repeat, "q", name)
        assert fields[b"fired"] == b"1"
        assert fields[b"last_fired_ms"] == str(due + 5).encode()


def test_an_ack_of_a_record_deleted_meanwhile_drops_the_lease_and_creates_nothing(
    any_repeat: Repeat,
) -> None:
    repeat = any_repeat
    repeat.register("q", "gone", every="1h", template={"task": "t"}, now_ms=T0)
    repeat.register("q", "kept", every="1h", template={"task": "t"}, now_ms=T0)
    due = T0 + HOUR
    leases = claim_due(repeat, "q", due)
    repeat.client.delete(repeat.keys("q").record("gone"))  # by hand, not a cancel
    repeat.ack("q", leases, deadline_ms=due + LEASE_MS, released_ms=due)
    assert repeat.leases("q") == []
    assert repeat.client.exists(repeat.keys("q").record("gone")) == 0
    assert record(repeat, "q", "kept")[b"fired"] == b"1"


def test_an_ack_restarts_a_garbage_counter_and_leaves_a_record_that_is_not_a_hash(
    any_repeat: Repeat,
) -> None:
    repeat = any_repeat
    for name in ("edited", "string"):
        repeat.register("q", name, every="1h", template={"task": "t"}, now_ms=T0)
    due = T0 + HOUR
    leases = claim_due(repeat, "q", due)
    keys = repeat.keys("q")
    repeat.client.hset(keys.record("edited"), "fired", "many")
    repeat.client.delete(keys.record("string"))
    repeat.client.set(keys.record("string"), "by hand")
    repeat.ack("q", leases, deadline_ms=due + LEASE_MS, released_ms=due + 7)
    assert repeat.leases("q") == []
    fields = record(repeat, "q", "edited")
    assert fields[b"fired"] == b"1" and fields[b"last_fired_ms"] == str(due + 7).encode()
    assert repeat.client.get(keys.record("string")) == b"by hand"


def test_an_ack_hands_back_only_what_it_did_not_drop(any_repeat: Repeat) -> None:
    repeat = any_repeat
    for name in ("sent", "unsent"):
        repeat.register("q", name, every="1h", template={"task": "t"}, now_ms=T0)
    due = T0 + HOUR
    leases = sorted(claim_due(repeat, "q", due))
    sent = leases[0]
    # A member both acked and handed back is dropped (the ack comes first), not handed back.
    repeat.ack("q", [sent], deadline_ms=due + LEASE_MS, released_ms=due, hand_back=leases)
    assert repeat.leases("q") == [("unsent", due, 0)]
    assert record(repeat, "q", "sent")[b"fired"] == b"1"
    assert b"fired" not in record(repeat, "q", "unsent")


def test_fetch_joins_templates_of_one_two_and_three_pieces_and_marks_a_missing_one(
    any_repeat: Repeat,
) -> None:
    repeat = any_repeat
    short = {"task": "t", "args": [1]}
    two = {"task": "t", "kwargs": {"tenant": "t" * 60}}
    three = {"task": "t", "kwargs": {"tenant": "t" * 130}}
    for name, template in (("short", short), ("two", two), ("three", three), ("torn", two)):
        repeat.register("q", name, every="1h", template=template, now_ms=T0)
    repeat.client.hdel(repeat.keys("q").record("torn"), "template.2")
    names = ["short", "two", "three", "torn", "missing"]
    fields = ["every_ms", "template", "template_pieces"]
    records = repeat.load_records("q", names, fields)
    for name, template in (("short", short), ("two", two), ("three", three)):
        stored = {k.decode(): v.decode() for k, v in record(repeat, "q", name).items()}
        assert records[name]["template"] == join_template(stored)
        assert json.loads(records[name]["template"]).get("kwargs", {}) == template.get("kwargs", {})
        assert records[name]["every_ms"] == str(HOUR)
        assert "template_pieces" not in records[name]
    assert record(repeat, "q", "three")[b"template_pieces"] == b"3"
    assert "\0" in records["torn"]["template"]  # a piece gone shows, as it did
    assert records["missing"] == {}
    # Asked without `template_pieces`, the pieces are not joined.
    alone = repeat.load_records("q", ["three"], ["template"])
    assert len(alone["three"]["template"]) <= 64


def test_an_ack_drops_its_leases_when_the_server_is_out_of_memory() -> None:
    """Out of memory (noeviction) between the send and the ack: counting `fired` is refused,
    the ack is not, so the leases go and nothing is sent again (a failed ack would leave
    every one of them to be re-sent when its lease expires)."""
    import redis

    from emq_bridge.embedded import EmbeddedServer

    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        repeat = Repeat(client, "oom")
        for name in ("a", "b"):
            repeat.register("q", name, every="1h", template={"task": "t"}, now_ms=T0)
        repeat.client.hset(repeat.keys("q").record("b"), "fired", "garbage")  # its error path
        due = T0 + HOUR
        leases = claim_due(repeat, "q", due)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1)
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # what the ack's count meets
            client.hincrby(repeat.keys("q").record("a"), "fired", 1)
        repeat.ack("q", leases, deadline_ms=due + LEASE_MS, released_ms=due)
        assert repeat.leases("q") == []
        client.config_set("maxmemory", 0)
