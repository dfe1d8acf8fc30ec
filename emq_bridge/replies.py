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
    except redis.RedisError as exc:
        raise RegistryError(f"{action}: {exc}") from exc
