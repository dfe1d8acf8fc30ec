"""The fingerprint of what a Celery app declares: a digest of everything its conversion reads.

Part of `emq_bridge.celery`. `app_fingerprint(app)` digests the app's `beat_schedule`
entries, its `@recurring` declarations, the settings and task options their conversion
reads (routing, time zone, emq-bridge's own settings), the names of the tasks the app knows
(the `@recurring` sync prunes only theirs) and the versions of the code that converts them,
so that two boots with one fingerprint convert to and prune the same declarations. The
beat stamps its sync with it (`sync.Stamp`), and an unchanged restart, finding the stamp,
skips the conversion and the sync.

What it cannot pin gives None, and the boot converts and syncs in full: a `task_routes`
router function (its code can change under the same name) or router path, a schedule of
a class other than Celery's plain `schedule` and `crontab` (a custom class holds state
its pickle need not show), an entry that is not a dict, and anything pickle refuses.

What is pickled is made canonical first, so that one declaration digests the same in every
process: a set or frozenset in a setting (`emq_bridge_queues` may be one) is pickled with its
items sorted (a set of strings iterates in an order `PYTHONHASHSEED` picks), and a kombu
`Queue`, `Exchange` or `binding` anywhere (in `task_queues`, an entry's options, a task's)
is pickled as its class and the attributes kombu declares and routes it by, a Queue's
`bindings` sorted (kombu keeps them in a set, which iterates in the order of the objects'
addresses).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
from collections.abc import Mapping
from datetime import timedelta
from operator import attrgetter
from typing import Any

from celery import Celery
from celery.schedules import crontab, schedule
from kombu.entity import Exchange, Queue, binding

from ..definition import Schedule
from ..stamps import code_versions
from .entries import own_tasks

__all__ = ["app_fingerprint"]

# Raised when what the conversion does with the same inputs changes without a release.
# 3: a kombu Queue or Exchange in options is stored described, not by name; 4: a key longer
# than a name is cut short with a digest, a schedule file prunes only the app's tasks; 5: a
# template keeps its dicts' key order (earlier releases stored them sorted, and a stamp of
# theirs would vouch for those records: the first boot syncs in full and rewrites them).
FORMAT = 5
# The settings the conversion reads, besides every `emq_bridge_*` one: the time zone, cron
# deadlines, and what routing reads (Celery's router and its queues).
_SETTINGS = (
    "timezone",
    "enable_utc",
    "beat_cron_starting_deadline",
    "task_default_queue",
    "task_default_exchange",
    "task_default_exchange_type",
    "task_default_routing_key",
    "task_default_priority",
    "task_queue_max_priority",
    "task_create_missing_queues",
    "task_queues",
    "task_routes",
    "worker_direct",
)
# Where an `emq_bridge_*` setting's name starts in a configuration key: Django-style
# configuration (`config_from_object(..., namespace="CELERY")`) lists it as
# `CELERY_EMQ_BRIDGE_GENERATION`, which `conf.get("emq_bridge_generation")` reads.
_EMQ_SETTING = "emq_bridge_"


def _emq_settings(conf: Any) -> set[str]:
    """The `emq_bridge_*` settings `conf` holds, by the names the conversion reads them by."""
    names = set()
    for key in conf:
        low = key.lower() if isinstance(key, str) else ""
        at = low.find(_EMQ_SETTING)
        if at >= 0:
            names.add(low[at:])
    return names


# Schedule values whose pickle is all the conversion reads of them.
_PLAIN_SCHEDULES = (int, float, timedelta, schedule, crontab)
# What a `@recurring` declaration holds, read in one C call (a dataclass's own pickle walks
# its fields in Python: 100,000 declarations pickled twice as slowly).
_SCHEDULE_FIELDS = tuple(f.name for f in dataclasses.fields(Schedule))
_schedule_values = attrgetter(*_SCHEDULE_FIELDS)


# The kombu classes described by their attributes rather than pickled as they are.
_KOMBU = (Queue, Exchange, binding)


def _canonical(value: Any) -> Any:
    """Return `value` as it is pickled for the fingerprint: a set or frozenset as a tuple
    of its items sorted by their canonical pickle (tagged with its class, so a set and a
    list of the same names differ), a kombu entity described (`_kombu_state`), a dict, list
    or tuple with its items made canonical in turn (a dict keeps its key order); anything
    else as it is (the pickler still describes a kombu entity inside it)."""
    kind = type(value)
    if kind is dict:
        return {key: _canonical(item) for key, item in value.items()}
    if kind is list:
        return [_canonical(item) for item in value]
    if kind is tuple:
        return tuple(_canonical(item) for item in value)
    if isinstance(value, set | frozenset):
        items = sorted((_canonical(item) for item in value), key=_dumps)
        return (f"{kind.__module__}.{kind.__qualname__}", tuple(items))
    if isinstance(value, _KOMBU):
        return _kombu_state(value)
    return value


def _kombu_state(value: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """A kombu `Queue`, `Exchange` or `binding` as its class and each attribute kombu
    declares and routes it by (its `attrs`, what its own pickle copies), made canonical: a
    Queue's `bindings` is a set, whose order would be the bindings' addresses."""
    kind = type(value)
    attrs = tuple(
        (name, _canonical(getattr(value, name, None))) for name, _ in getattr(kind, "attrs", ())
    )
    return (f"{kind.__module__}.{kind.__qualname__}", attrs)


class _Pickler(pickle.Pickler):
    """pickle, with a kombu entity wherever it is pickled as `_kombu_state` describes it."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _KOMBU):
            return tuple, (_kombu_state(obj),)
        return NotImplemented


def _dumps(value: Any) -> bytes:
    """The pickle of `value` the fingerprint digests (`_Pickler`)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(value)
    return buffer.getvalue()


def _route_is_data(route: Any) -> bool:
    """True for a `task_routes` map (glob or pattern -> queue name or options)."""
    return isinstance(route, Mapping) and all(
        isinstance(value, (str, Mapping)) for value in route.values()
    )


def _routes_are_data(routes: Any) -> bool:
    """True when `task_routes` is maps only: a router function or its import path may route
    differently under the same name, so no fingerprint can pin it."""
    if routes is None:
        return True
    if isinstance(routes, (list, tuple)):
        return all(_route_is_data(route) for route in routes)
    return _route_is_data(routes)


def _entry_tasks(entries: Mapping[str, Any]) -> set[str] | None:
    """The task names of `entries`, or None if one cannot be pinned (see the module)."""
    tasks: set[str] = set()
    for raw in entries.values():
        if type(raw) is not dict:
            return None
        value = raw.get("schedule")
        if value is not None and type(value) not in _PLAIN_SCHEDULES:
            return None
        if isinstance(value, schedule) and value.relative:
            return None
        task = raw.get("task")
        tasks.add(task if isinstance(task, str) else "")
    return tasks


def _decorated(app: Celery, declared: list[tuple[Any, Any]]) -> list[tuple[str, Any]] | None:
    """The app's own `@recurring` declarations, as `declare._decorated` keeps them: (task
    name, the values of its `Schedule`); None if one is not a `Schedule`."""
    if any(type(schedule) is not Schedule for _, schedule in declared):
        return None
    return [(task.name, _schedule_values(schedule)) for task, schedule in own_tasks(app, declared)]


def _task_options(app: Celery, names: set[str]) -> list[tuple[str, Any]]:
    """Per task named, whether it is known and the sending options its routing starts from."""
    found = []
    for name in sorted(names):
        task = app.tasks.get(name)
        options = task._get_exec_options() if task is not None else None
        found.append((name, None if options is None else sorted(options.items())))
    return found


def app_fingerprint(
    app: Celery, entries: Mapping[str, Any], declared: list[tuple[Any, Any]]
) -> str | None:
    """Return the fingerprint of `app`'s declarations (`entries`: its `beat_schedule` with
    Celery's default entries; `declared`: every `@recurring` declaration of the process), or
    None when something in them cannot be pinned (see the module)."""
    conf = app.conf
    if not _routes_are_data(conf.get("task_routes")):
        return None
    tasks = _entry_tasks(entries)
    if tasks is None:
        return None
    decorated = _decorated(app, declared)
    if decorated is None:
        return None
    tasks.update(name for name, _ in decorated)
    try:
        settings = [(key, _canonical(conf.get(key))) for key in _SETTINGS]
        settings += [(name, _canonical(conf.get(name))) for name in sorted(_emq_settings(conf))]
    except Exception:  # an item pickle refuses, in a set sorted by its pickle: a full boot
        return None
    state = (
        (FORMAT, *code_versions("emq-bridge", "celery", "kombu")),
        settings,
        repr(app.timezone),
        sorted(app.amqp.queues),
        _task_options(app, tasks),
        entries,
        _SCHEDULE_FIELDS,
        decorated,
        sorted(app.tasks),  # what the `@recurring` sync may prune (declare._sync_own)
    )
    try:
        encoded = _dumps(state)
    except Exception:  # anything pickle refuses: no fingerprint, so a full boot
        return None
    return hashlib.blake2b(encoded, digest_size=16).hexdigest()
