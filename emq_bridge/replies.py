"""Replies and errors at the redis-py boundary: decode a reply item, map redis-py's exceptions.

Shared by the registry's modules (`registry`, `lifecycle`) and the list dispatcher.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from .errors import RegistryError, RegistryOutOfMemory, RegistryRedirected, RegistryUnavailable

__all__ = ["CLUSTER_NODE", "is_template_field", "record_text", "redis_errors", "replaced", "text"]

# Why a plain client cannot use a Redis Cluster node (an ElastiCache cluster-mode endpoint
# given as redis://): the node holds its own slots' keys only, and redirects the others.
CLUSTER_NODE = (
    "the server is a Redis Cluster node, which a plain redis:// client reaches only part of; "
    "connect with a redis+cluster:// URL (rediss+cluster:// for TLS)"
)
# An outage's message quotes redis-py's reason up to here: one line, whatever it holds.
MAX_REASON_CHARS = 200


def text(value: Any) -> str:
    """Decode a Redis reply item, whatever the client's `decode_responses` is."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def is_template_field(name: str) -> bool:
    """Whether the record field `name` holds the template (`template`, `template.2`, ...)."""
    return name.startswith("template") and (name == "template" or name[8:9] == ".")


def record_text(raw: Any) -> dict[str, str]:
    """Decode a record's fields (an HGETALL reply) as `text` does, but the template's: bytes
    that are not UTF-8 there stay lone surrogates (`surrogateescape`), which the template's
    decoder refuses, so such a record is corrupt rather than sent with U+FFFD instead."""
    out = {}
    for key, value in raw.items():
        name = text(key)
        if isinstance(value, bytes) and is_template_field(name):
            out[name] = value.decode("utf-8", "surrogateescape")
        else:
            out[name] = text(value)
    return out


def replaced(value: str) -> str:
    """`value` with its lone surrogates (bytes that were not UTF-8) as U+FFFD, as `text`
    decodes them."""
    if value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# What a server answers while a failover is under way (a cluster slot without its master,
# a replica not yet promoted): an outage, not a broken registry.
_FAILING_OVER = (
    redis.exceptions.ClusterDownError,  # and MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
)

# A pipeline's error names its command first: `Command # <n> (<command>) of pipeline caused
# error: <reply>` (its type stays, but a plain ResponseError's code is only in the text).
_PIPELINE_ERROR = re.compile(r"Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)


def _code(error: redis.RedisError) -> str:
    """Return the code of `error`'s reply (`BUSY`...): redis-py 8 keeps it as `status_code`,
    older ones only in the text (after a pipeline's prefix)."""
    code = getattr(error, "status_code", None)
    if isinstance(code, str):
        return code
    reply = str(error)
    in_pipeline = _PIPELINE_ERROR.match(reply)
    return reply[in_pipeline.end() if in_pipeline else 0 :].partition(" ")[0]


def _as_busy(error: redis.RedisError) -> redis.RedisError:
    """Return `error` as a `BusyLoadingError` when its reply is BUSY, else `error`.

    A server running a script or function past `busy-reply-threshold` answers BUSY to every
    other command until it ends (or is killed), as one loading its data set answers LOADING,
    which redis-py reads as `BusyLoadingError`; BUSY it reads as a plain `ResponseError`. Both
    are an outage that passes, not a broken registry."""
    if type(error) is not redis.ResponseError or _code(error) != "BUSY":
        return error
    reply = str(error)
    return redis.exceptions.BusyLoadingError(reply.removeprefix("BUSY "))


# Redis 6.2 wraps an error met inside a script (a `redis.call` that failed) in its own text,
# which redis-py cannot read, so it raises a plain `ResponseError`:
#   Error running script (call to f_<sha>): @user_script:<line>: <reply>
# and a command refused before it ran (READONLY) adds `@user_script: <line>: -` before the
# reply. 7.0 and later answer the reply first (`<reply> script: <sha>, on @user_script:<line>.`),
# which redis-py maps to its typed exceptions (`ReadOnlyError`...).
_SCRIPT_ERROR_62 = re.compile(
    r"Error running script \(call to f_(?P<sha>[0-9a-f]+)\): @user_script:(?P<line>\d+): "
    r"(?:@user_script: \d+: -)?(?P<reply>.*)",
    re.DOTALL,
)
# What redis-py makes of a reply's code, as it reads 7.0's: the failover's codes (which
# `redis_errors` tells apart) are exceptions of their own, and these codes are taken off the
# text (ERR too); any other reply (WRONGTYPE ...) stays whole, a `ResponseError`.
_CODES: dict[str, type[redis.RedisError]] = {
    "ERR": redis.ResponseError,
    "READONLY": redis.exceptions.ReadOnlyError,
    "CLUSTERDOWN": redis.exceptions.ClusterDownError,
    "MASTERDOWN": redis.exceptions.MasterDownError,
    "TRYAGAIN": redis.exceptions.TryAgainError,
    "OOM": redis.exceptions.OutOfMemoryError,
}


def _as_from_7(error: redis.RedisError) -> redis.RedisError:
    """Return `error` as redis-py reads the same reply from Redis 7.0 when it is Redis 6.2's
    text of an error inside a script; else `error`. So a failover met inside a script is an
    outage on 6.2 too, and users read the same message, the server's reply first."""
    if type(error) is not redis.ResponseError:
        return error
    wrapped = _SCRIPT_ERROR_62.fullmatch(str(error))
    if wrapped is None:
        return error
    reply = f"{wrapped['reply']} script: {wrapped['sha']}, on @user_script:{wrapped['line']}."
    code, _, rest = reply.partition(" ")
    kind = _CODES.get(code)
    return redis.ResponseError(reply) if kind is None else kind(rest)


# Where redis-py names the server in a connection error: `Error 111 connecting to
# <host>:<port>. Connection refused.`, `Timeout reading from <host>:<port>`, `Error while
# reading from <host>:<port> : (104, ...)`. The host is cut from the URL as redis-py reads it,
# which takes part of a password holding an unescaped '#', '?' or '/' for the host.
_SERVER_NAMED = re.compile(r"\b(connecting to|reading from) .+?(?=\.(?: |$)| ?: |$)")


def _reason(error: redis.RedisError) -> str:
    """Return redis-py's reason for a failed connection, for a message: on one line, the
    server's address left out (it may hold a piece of the password), cut at
    `MAX_REASON_CHARS`. The server's replies (an AUTH refused) never quote the password."""
    line = _SERVER_NAMED.sub(r"\1 the server", " ".join(str(error).split()))
    if len(line) > MAX_REASON_CHARS:
        line = f"{line[:MAX_REASON_CHARS]}…"
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _raised_in_redis_py(error: BaseException) -> bool:
    """Whether `error` was raised in redis-py's code (its decoding of a reply)."""
    frame = None
    trace = error.__traceback__
    while trace is not None:
        frame, trace = trace.tb_frame, trace.tb_next
    return frame is not None and f"{os.sep}redis{os.sep}" in frame.f_code.co_filename


def _pool_exhausted(error: redis.RedisError) -> bool:
    """Whether `error` is a connection pool with none left (`max_connections` reached): a
    `ConnectionPool`'s `MaxConnectionsError`, a `BlockingConnectionPool`'s timeout."""
    return isinstance(error, redis.exceptions.MaxConnectionsError) or (
        type(error) is redis.ConnectionError and str(error) == "No connection available."
    )


def _redirected(error: redis.exceptions.AskError) -> str:
    """Return the redirection `error` answered, as the server sent it (`MOVED 3999 host:6379`)."""
    code = "MOVED" if isinstance(error, redis.exceptions.MovedError) else "ASK"
    return f"{code} {error.slot_id} {error.host}:{error.port}"


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Map redis-py's exceptions to ours at this one boundary."""
    try:
        try:
            yield
        except redis.ResponseError as exc:
            read = _as_busy(_as_from_7(exc))
            if _code(read) == "NOREPLICAS":
                # `min-replicas-to-write` (guarantees.md, "Failover"): the master refuses
                # writes while too few replicas are in sync; they come back soon, so an
                # outage (workers keep their reports), not a broken registry.
                raise RegistryUnavailable(
                    f"{action}: Redis refuses writes while too few replicas are in sync "
                    f"(min-replicas-to-write): {read}"
                ) from exc
            if read is exc:
                raise
            raise read from exc
    except UnicodeDecodeError as exc:
        if not _raised_in_redis_py(exc):  # the code the block ran, not a reply: its own
            raise
        raise RegistryError(
            f"{action}: a reply holds bytes that are not UTF-8 (a key or value edited by "
            "hand?), which a client with decode_responses=True cannot read: give emq-bridge "
            "a client without it, which reads such a record as corrupt and parks it"
        ) from exc
    except redis.exceptions.BusyLoadingError as exc:  # a ConnectionError to redis-py
        # The server is busy (a slow script: BUSY) or loading its data set (LOADING): it
        # serves again soon on the same connection; an outage, retried and told once.
        raise RegistryUnavailable(f"{action}: Redis cannot serve it now: {exc}") from exc
    except redis.AuthenticationError as exc:  # a ConnectionError to redis-py
        raise RegistryUnavailable(
            f"{action}: Redis refused the credentials; check the user and password ({_reason(exc)})"
        ) from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if _pool_exhausted(exc):  # no new connection was tried: all are in use
            raise RegistryUnavailable(
                f"{action}: the client's connection pool has no free connection "
                f"({_reason(exc)}): too few for the threads that use it (max_connections; a "
                "pump holds one for its wake-ups, a worker's reporter one, each thread that "
                "calls Redis one), or they all wait on a server that does not answer"
            ) from exc
        # Its reason tells a refused connection from a TLS certificate refused or a CA file
        # not found, which a pump or a beat logs no other way.
        raise RegistryUnavailable(f"{action}: Redis is unreachable ({_reason(exc)})") from exc
    except redis.exceptions.OutOfMemoryError as exc:  # a ResponseError to redis-py
        # Writes refused until memory frees (reads still served): workers' heartbeats and
        # reports too, so it is an outage for the moves, not a broken registry.
        raise RegistryOutOfMemory(
            f"{action}: Redis is out of memory and refuses writes ({_reason(exc)})"
        ) from exc
    except redis.exceptions.AskError as exc:  # and MovedError
        # A RedisCluster follows redirections itself (and says "TTL exhausted" when they run
        # out): this client is a plain one, on one node of a cluster.
        raise RegistryError(f"{action}: {CLUSTER_NODE} (it answered {_redirected(exc)})") from exc
    except _FAILING_OVER as exc:
        # A cluster or a replica in the middle of a failover: an outage, retried and told
        # once, not a broken registry (a read-only replica named by mistake says so too).
        raise RegistryUnavailable(f"{action}: Redis cannot serve it now: {exc}") from exc
    except redis.exceptions.ClusterError as exc:  # ClusterDownError is caught above
        # redis-py gave up after its redirections ran out ("TTL exhausted."): the slot moved
        # again and again (ASK, then TRYAGAIN for a script whose keys are split mid-migration)
        # or its master was failing over. This move failed; a pump serves the other queues
        # and retries this one (`RegistryRedirected`: a passing state, told at WARNING).
        raise RegistryRedirected(
            f"{action}: the Redis Cluster kept redirecting (a slot migrating or failing "
            f"over): {exc}"
        ) from exc
    except redis.RedisError as exc:
        raise RegistryError(f"{action}: {exc}") from exc
