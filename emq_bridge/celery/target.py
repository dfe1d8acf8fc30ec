"""The Celery target of `emq-bridge pump --celery SPEC`: the app's dispatcher, queues, schedules."""

from __future__ import annotations

from celery import Celery

from ..dispatch import PumpTarget
from ..errors import ConfigError
from .declare import app_schedule
from .dispatch import CeleryDispatcher
from .pipelined import PipelinedCeleryDispatcher

__all__ = ["load_target"]


def load_target(spec: str, *, pipelined: bool = False) -> PumpTarget:
    """Return the pump target of the Celery app `spec` ("proj" or "proj.celery:app").

    `pipelined=True` sends through `PipelinedCeleryDispatcher` (a Redis broker only).

    The app is found the way `celery -A` finds it, and its task modules are imported.
    Schedule-file entries are not included (they have their own source).
    """
    from celery.app.utils import find_app

    try:
        app = find_app(spec)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the Celery app {spec!r}: {exc}") from exc
    if not isinstance(app, Celery):
        raise ConfigError(f"{spec!r} is {type(app).__name__}, not a Celery app")
    app.loader.import_default_modules()
    app.finalize(auto=True)
    plan = app_schedule(app)
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    return PumpTarget(dispatcher, plan.queues, plan.declarations, plan.source, plan.resolve_cadence)
