"""A sync goes through while the server's script cache is emptied (found by a probe of
tenants sharing one Redis, session 35).

Any user of a shared server may send `SCRIPT FLUSH` (it is in `@scripting`, not
`@dangerous`), and a failover to a replica that never loaded a script empties it too. The
overlapped calls of a sync (`overlap.overlapped_calls`) loaded the script once, then sent raw
`EVALSHA`s: the first call after a flush failed with NOSCRIPT, and the sync stopped midway
(exit 3, 300 of 4,000 schedules written). A call that meets NOSCRIPT did not run: it is sent
again once the script is loaded again, as redis-py's `Script` does, its reply in its turn.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from emq_bridge import Repeat
from emq_bridge.definition import define
from emq_bridge.overlap import overlapped_calls

ECHO = "return ARGV[1]"


def another_client(client: redis.Redis) -> redis.Redis:
    """A client of the same server on a pool of its own."""
    return redis.Redis(
        connection_pool=redis.ConnectionPool(**client.connection_pool.connection_kwargs)
    )


@contextmanager
def flushing(client: redis.Redis, every_s: float) -> Iterator[None]:
    """Another client sends `SCRIPT FLUSH` every `every_s` while the block runs."""
    flusher = another_client(client)
    stop = threading.Event()

    def flush() -> None:
        while not stop.wait(every_s):
            flusher.script_flush()

    thread = threading.Thread(target=flush, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        flusher.close()


def test_calls_that_meet_a_flushed_cache_are_sent_again_in_order(client: redis.Redis) -> None:
    script = client.register_script(ECHO)
    other = another_client(client)

    def calls() -> Iterator[tuple[list[str], list[Any]]]:
        for i in range(40):
            if i in (3, 4, 17, 39):  # while call i-1 (and maybe i-2) are in flight
                other.script_flush()
            yield [], [str(i)]

    try:
        replies = [int(reply) for reply in overlapped_calls(client, script, calls())]
    finally:
        other.close()
    assert replies == list(range(40))


def test_a_sync_under_a_stream_of_script_flushes_writes_every_schedule(
    client: redis.Redis, prefix: str
) -> None:
    repeat = Repeat(client, prefix)
    definition = define(every="1h", template={"task": "t"})
    declared = [(f"q{i % 8}", f"s{i:05d}", definition) for i in range(8000)]
    with flushing(client, 0.005):
        results = repeat.upsert_many(declared)
    assert len(results) == len(declared)
    assert sum(len(repeat.names(f"q{k}")) for k in range(8)) == len(declared)


def test_a_name_given_twice_ends_as_its_last_definition_under_script_flushes(
    client: redis.Redis, prefix: str
) -> None:
    # Session 35 (a review): a chunk sent again after NOSCRIPT ran after the chunks behind
    # it; a name given twice, in two chunks, could end as its first definition. Such calls
    # now run in order, never overlapped.
    repeat = Repeat(client, prefix)
    first = define(every="1h", template={"task": "A"})
    last = define(every="1h", template={"task": "B"})
    filler = define(every="1h", template={"task": "t"})
    with flushing(client, 0.001):
        for round_ in range(3):
            items = [("q", f"x{round_}", first)]
            items += [("q", f"f{round_}-{i:04d}", filler) for i in range(1200)]
            items += [("q", f"x{round_}", last)]
            results = repeat.upsert_many(items)
            assert (results[0], results[-1]) == ("created", "updated")
            stored = repeat.get("q", f"x{round_}")
            assert stored is not None and stored.definition.template["task"] == "B"
