"""Run a sequence of script calls so the client prepares call k+1 while the server runs call k.

A large sync is half client work (encoding items) and half server work (the upsert script).
Sent one after the other they add up; here each call is written to the connection before the
reply of the previous one is read, so the two overlap. One thread, one connection, calls in
order: no GIL hand-offs, and the server still sees one script after another.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["overlapped_calls"]


def overlapped_calls(
    client: Any, script: Any, calls: Iterable[tuple[list[str], list[Any]]]
) -> Iterator[Any]:
    """Yield the reply of each `(keys, args)` call of the redis-py `Script` `script`, in order.

    `calls` may be a generator: its next item is computed while the server runs the previous
    call. A single call, or a Redis Cluster client (whose connections are per node), is run
    as a plain `script(...)`. On an error, the call sent after the failing one may have run
    too; the connection is dropped.
    """
    pending = iter(calls)
    first = next(pending, None)
    if first is None:
        return
    second = next(pending, None)
    pool = getattr(client, "connection_pool", None)
    if second is None or pool is None:  # one call, or a RedisCluster: one at a time
        for keys, args in itertools.chain([first], [second] if second else [], pending):
            yield script(keys=keys, args=args)
        return
    script.sha = client.script_load(script.script)  # so that EVALSHA cannot meet NOSCRIPT
    try:
        connection = pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants the command name
        connection = pool.get_connection("EVALSHA")
    try:
        waiting = False
        for keys, args in itertools.chain([first, second], pending):
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            if waiting:
                yield connection.read_response()
            waiting = True
        yield connection.read_response()
    except BaseException:
        connection.disconnect()  # a reply may still be in flight; never reuse it
        raise
    finally:
        pool.release(connection)
