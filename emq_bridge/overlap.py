"""Run a sequence of script calls so the client prepares call k+1 while the server runs call k.

A large sync is half client work (encoding items) and half server work (the upsert script).
Sent one after the other they add up; here each call is written to the connection before the
reply of the previous one is read, so the two overlap. One thread, one connection, calls in
order: no GIL hand-offs, and the server still sees one script after another.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

__all__ = ["overlapped_calls"]


def overlapped_calls(
    client: Any,
    script: Any,
    calls: Iterable[tuple[list[str], list[Any]]],
    *,
    in_order: bool = False,
) -> Iterator[Any]:
    """Yield the reply of each `(keys, args)` call of the redis-py `Script` `script`, in order.

    `calls` may be a generator: its next item is computed while the server runs the previous
    call. A single call, or a Redis Cluster client (whose connections are per node), is run
    as a plain `script(...)`; calls that must run in order whatever happens (`in_order`: two
    of them write one key) are sent one at a time, each once the one before answered. A call
    that meets NOSCRIPT (the server's script cache emptied meanwhile: it did not run) is sent
    again as an `EVAL` of the script's body (`_after_noscript`). On another error, the call
    sent after the failing one may have run too; the connection is dropped.
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
    script.sha = client.script_load(script.script)  # so that EVALSHA rarely meets NOSCRIPT
    try:
        connection = pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants the command name
        connection = pool.get_connection("EVALSHA")
    inflight: deque[tuple[list[str], list[Any]]] = deque()
    try:
        window = 1 if in_order else 2  # calls on the wire at once
        for call in itertools.chain([first, second], pending):
            _send(connection, script, call)
            inflight.append(call)
            if len(inflight) >= window:
                yield from _replies(connection, script, inflight, 1)
        yield from _replies(connection, script, inflight, len(inflight))
    except BaseException:
        connection.disconnect()  # a reply may still be in flight; never reuse it
        raise
    finally:
        pool.release(connection)


def _send(connection: Any, script: Any, call: tuple[list[str], list[Any]]) -> None:
    keys, args = call
    connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)


def _replies(
    connection: Any, script: Any, inflight: deque[tuple[list[str], list[Any]]], count: int
) -> Iterator[Any]:
    """Yield the replies of the `count` oldest calls in flight, in order (all of them when
    one met NOSCRIPT: `_after_noscript`)."""
    for _ in range(count):
        try:
            reply = connection.read_response()
        except NoScriptError:
            yield from _after_noscript(connection, script, inflight)
            return
        inflight.popleft()
        yield reply


# What `_after_noscript` notes of a call that met NOSCRIPT: it did not run.
_NOT_RUN = object()


def _after_noscript(
    connection: Any, script: Any, inflight: deque[tuple[list[str], list[Any]]]
) -> Iterator[Any]:
    """The oldest call in flight met NOSCRIPT: the server's script cache was emptied (a
    `SCRIPT FLUSH`, which any user may send on a shared server, a failover to a replica that
    never loaded it) and the call did not run. Read the replies of the calls sent after it
    (each ran, or met NOSCRIPT too), send again each that did not run (`_run_again`), and
    yield every reply in the calls' order. A call sent again runs after the ones behind it
    that did run: calls that write a key twice must not overlap (`in_order`)."""
    outcomes: list[Any] = [_NOT_RUN]
    for _ in range(len(inflight) - 1):
        try:
            outcomes.append(connection.read_response())
        except NoScriptError:
            outcomes.append(_NOT_RUN)
        except ResponseError as exc:  # the script's own error: raised in its turn
            outcomes.append(exc)
    calls = list(inflight)
    inflight.clear()
    for call, outcome in zip(calls, outcomes, strict=True):
        if outcome is _NOT_RUN:
            yield _run_again(connection, script, call)
        elif isinstance(outcome, ResponseError):
            raise outcome
        else:
            yield outcome


def _run_again(connection: Any, script: Any, call: tuple[list[str], list[Any]]) -> Any:
    """Send `call` again as an `EVAL` of the script's body, which no flush can refuse (and
    which caches the script again for the `EVALSHA`s after it); its reply."""
    keys, args = call
    connection.send_command("EVAL", script.script, len(keys), *keys, *args)
    return connection.read_response()
