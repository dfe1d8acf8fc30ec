"""What kombu publishes, seen from a test: the spy both Celery routing test files use."""

from __future__ import annotations

from typing import Any
from unittest import mock

from kombu.messaging import Producer


def described(entity: Any) -> Any:
    """A kombu entity as kombu copies it (`as_dict`), its bindings in a stable order."""
    if not hasattr(entity, "as_dict"):
        return entity
    found = entity.as_dict(recurse=True)
    found["class"] = type(entity).__name__
    if "bindings" in found:
        found["bindings"] = sorted(found["bindings"], key=repr)
    return found


def published(send: Any) -> list[tuple[Any, ...]]:
    """What `send()` publishes: the exchange, routing key, delivery mode and declared
    entities of each message, as kombu's `Producer.publish` receives them."""
    seen: list[tuple[Any, ...]] = []
    original = Producer.publish

    def publish(self: Producer, body: Any, **kwargs: Any) -> Any:
        exchange = kwargs.get("exchange")
        seen.append(
            (
                described(exchange),
                kwargs.get("routing_key"),
                kwargs.get("delivery_mode"),
                [described(entity) for entity in kwargs.get("declare") or []],
            )
        )
        return original(self, body, **kwargs)

    with mock.patch.object(Producer, "publish", publish):
        send()
    return seen
