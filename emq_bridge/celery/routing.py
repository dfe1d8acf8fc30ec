"""`resolve_queue`: the queue Celery's own routing sends a task to.

Part of `emq_bridge.celery`: a `beat_schedule` entry's registry queue (`entries`), and the
dispatcher's check that a task's routing names its registry queue, so that it is sent as
Celery's beat sends it (`dispatch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery
from kombu.entity import Queue

from ..errors import ConfigError
from .kombu_entities import routing_entities

__all__ = ["resolve_queue"]


def resolve_queue(
    app: Celery, task_name: str, options: Mapping[str, Any], args: Any, kwargs: Any
) -> str:
    """Return the Celery queue a task is sent to: the options, else the task's routing.

    `options` are a template's (`json_options`): a kombu `Queue` or `Exchange` described
    there is routed as the object."""
    try:
        options = routing_entities(options)
    except ValueError as exc:
        raise ConfigError(f"cannot route task {task_name!r}: {exc}") from exc
    task = app.tasks.get(task_name)
    preset = {k: v for k, v in (task._get_exec_options() if task else {}).items() if v is not None}
    merged = dict(preset, **options)
    try:
        route = app.amqp.router.route(merged, task_name, args, kwargs, task_type=task)
    except Exception as exc:  # task_routes callables and QueueNotFound
        raise ConfigError(f"cannot route task {task_name!r}: {exc}") from exc
    queue = route.get("queue")
    name = queue.name if isinstance(queue, Queue) else queue
    return str(name or app.conf.task_default_queue)
