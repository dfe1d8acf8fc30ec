"""Replies and errors at the redis-py boundary: decode a reply item, map redis-py's exceptions.

Shared by the registry's modules (`registry`, `lifecycle`) and the list dispatcher.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from .errors import RegistryError, RegistryUnavailable

__all__ = ["redis_errors", "text"]


def text(value: Any) -> str:
    """Decode a Redis reply item, whatever the client's `decode_responses` is."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# What a server answers while a failover is under way (a cluster slot without its master,
# a replica not yet promoted): an outage, not a broken registry.
_FAILING_OVER = (
    redis.exceptions.ClusterDownError,  # and MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
)


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Map redis-py's exceptions to ours at this one boundary."""
    try:
        yield
    except redis.AuthenticationError as exc:  # a ConnectionError to redis-py
        raise RegistryUnavailable(
            f"{action}: Redis refused the credentials; check the user and password"
        ) from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RegistryUnavailable(f"{action}: Redis is unreachable ({type(exc).__name__})") from exc
    except _FAILING_OVER as exc:
        # A cluster or a replica in the middle of a failover: an outage, retried and told
        # once, not a broken registry (a read-only replica named by mistake says so too).
        raise RegistryUnavailable(f"{action}: Redis cannot serve it now: {exc}") from exc
    except redis.exceptions.ClusterError as exc:  # ClusterDownError is caught above
        # redis-py gave up after its redirections ran out ("TTL exhausted."): the slot moved
        # again and again (ASK, then TRYAGAIN for a script whose keys are split mid-migration)
        # or its master was failing over. This move failed; a pump serves the other queues.
        raise RegistryError(
            f"{action}: the Redis Cluster kept redirecting (a slot migrating or failing "
            f"over): {exc}"
        ) from exc
    except redis.RedisError as exc:
        raise RegistryError(f"{action}: {exc}") from exc
