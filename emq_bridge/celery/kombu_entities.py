"""kombu `Queue` and `Exchange` objects in a task template, as JSON and back.

Celery's `apply_async` takes a kombu `Queue` as `queue` and an `Exchange` as `exchange`, and
Celery's beat passes such objects from a `beat_schedule` entry's `options` as they are. A
template is JSON, so `entity_json` describes such an object (every attribute kombu declares
and routes it by) and `entity_from_json` rebuilds an equal one at each send
(`routing_entities`): the task is routed as Celery's beat routes it, never by the name alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kombu.entity import Exchange, Queue, binding

__all__ = [
    "ENTITY_OPTIONS",
    "KOMBU_TAG",
    "entity_from_json",
    "entity_json",
    "routing_entities",
]

# Those Celery's `apply_async` also takes as kombu objects (what Celery's beat passes as
# they are), and the class each takes. A template stores such an object as its JSON
# description (`entity_json`), rebuilt at each send (`routing_entities`).
ENTITY_OPTIONS: dict[str, type] = {"queue": Queue, "exchange": Exchange}
# The key of a description that names its kombu class ("Queue", "Exchange", "binding").
KOMBU_TAG = "kombu"
_ENTITIES: dict[str, type] = {"Queue": Queue, "Exchange": Exchange, "binding": binding}
# The attributes of each class kombu declares, binds and routes by (its `attrs`, what its
# `as_dict` and pickling copy); a Queue's exchange and bindings are entities themselves.
_ATTRS: dict[type, tuple[str, ...]] = {
    kind: tuple(name for name, _ in getattr(kind, "attrs", ())) for kind in _ENTITIES.values()
}


def routing_entities(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return `options` with the description of a kombu `Queue` (`queue`) or `Exchange`
    (`exchange`) rebuilt as that object, for `apply_async`; `ValueError` if one is not a
    description `entity_json` writes."""
    out = dict(options)
    for key, kind in ENTITY_OPTIONS.items():
        value = out.get(key)
        if isinstance(value, Mapping):
            out[key] = entity_from_json(kind, value)
    return out


def entity_json(value: Any) -> dict[str, Any]:
    """Return the JSON description of a kombu `Queue`, `Exchange` or `binding`: its class
    under `"kombu"` and each attribute kombu declares and routes it by (its `attrs`) that is
    set, a Queue's exchange and bindings described in turn (the bindings in a stable order).

    `entity_from_json` rebuilds an equal object. Raise `ValueError` naming what cannot be
    stored: a subclass (`Broadcast`, ...), a Queue with no name or an `on_declared`
    callback, a binding whose exchange is not an `Exchange`, or an attribute that is not
    plain JSON (string keys; no bytes, datetimes, NaN)."""
    kind = type(value)
    tag = next((name for name, cls in _ENTITIES.items() if cls is kind), None)
    if tag is None:
        base = next((cls for cls in _ENTITIES.values() if isinstance(value, cls)), None)
        if base is not None:
            raise ValueError(
                f"a {kind.__name__} (a subclass of kombu's {base.__name__}) cannot be "
                f"stored; give a plain kombu {base.__name__}, or its name"
            )
        raise ValueError(f"{value!r} is not a kombu Queue or Exchange")
    if kind is Queue:
        if not isinstance(value.name, str) or not value.name:
            raise ValueError("a Queue without a name cannot be stored")
        if value.on_declared is not None:
            raise ValueError(f"the on_declared callback of Queue {value.name!r} cannot be stored")
    out: dict[str, Any] = {KOMBU_TAG: tag}
    for name in _ATTRS[kind]:
        given = getattr(value, name, None)
        if given is None:
            continue
        if name == "exchange":
            if not isinstance(given, Exchange):
                raise ValueError(f"the exchange {given!r} of {value!r} is not a kombu Exchange")
            out[name] = entity_json(given)
        elif name == "bindings":
            described = [entity_json(item) for item in given]
            out[name] = sorted(described, key=lambda item: json.dumps(item, sort_keys=True))
        else:
            out[name] = _plain_json(given, f"the {name} of {value!r}")
    return out


def _plain_json(value: Any, what: str) -> Any:
    """Return `value` as JSON gives it back (tuples become lists); `ValueError` if JSON would
    change it otherwise (a key that is not a string) or refuses it."""
    _string_keys(value, what)
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not plain JSON: {exc}") from exc


def _string_keys(value: Any, what: str) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{what} has a key {key!r} that is not a string")
            _string_keys(item, what)
    elif isinstance(value, list | tuple):
        for item in value:
            _string_keys(item, what)


def _thawed(value: Any) -> Any:
    """Return `value` with every mapping a dict and every list a list of its own: a stored
    template is read-only (`FrozenDict`), and kombu and Celery may update what they get."""
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(item) for item in value]
    return value


def entity_from_json(kind: type, data: Any) -> Any:
    """Return the kombu object of class `kind` that `data` (`entity_json`'s description)
    describes; `ValueError` if it describes no such object."""
    tag = next(name for name, cls in _ENTITIES.items() if cls is kind)
    if not isinstance(data, Mapping) or data.get(KOMBU_TAG) != tag:
        raise ValueError(f"{data!r} is not the description of a kombu {tag}")
    fields = {key: _thawed(value) for key, value in data.items() if key != KOMBU_TAG}
    unknown = sorted(set(fields) - set(_ATTRS[kind]))
    if unknown:
        raise ValueError(f"a kombu {tag} has no attribute {unknown[0]!r}")
    exchange = fields.pop("exchange", None)
    if exchange is not None:
        fields["exchange"] = entity_from_json(Exchange, exchange)
    if "bindings" in fields:
        bindings = fields["bindings"]
        if not isinstance(bindings, list):
            raise ValueError(f"the bindings of a kombu {tag} must be a list, got {bindings!r}")
        fields["bindings"] = [entity_from_json(binding, item) for item in bindings]
    if kind is Queue and (not isinstance(fields.get("name"), str) or not fields["name"]):
        raise ValueError(f"a kombu Queue needs a name, got {fields.get('name')!r}")
    if kind is Exchange and not isinstance(fields.get("name", ""), str):
        raise ValueError(f"a kombu Exchange's name must be a string, got {fields['name']!r}")
    try:
        return kind(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{data!r} does not describe a kombu {tag}: {exc}") from exc
