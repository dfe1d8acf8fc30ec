"""The Celery target of `emq-bridge pump --celery SPEC`: the app's dispatcher, queues, registry."""

from __future__ import annotations

from celery import Celery

from ..dispatch import PumpTarget
from ..errors import ConfigError, EmqError
from ..registry import Repeat
from ..targets import app_failed, declared_at
from .declare import app_schedule, registry_prefix, registry_url, repeat_for, sync_app
from .dispatch import CeleryDispatcher
from .pipelined import PipelinedCeleryDispatcher
from .reporting import history_size_setting

__all__ = ["load_target"]


def load_target(spec: str, *, pipelined: bool = False) -> PumpTarget:
    """Return the pump target of the Celery app `spec` ("proj" or "proj.celery:app").

    `pipelined=True` sends through `PipelinedCeleryDispatcher` (a Redis broker only).

    The app is found the way `celery -A` finds it, and its task modules are imported.
    The command syncs as the beat does (`sync_app`): `beat_schedule` and `@recurring` under
    the app's source, the `emq_bridge_schedule_file` under its own, each at
    `emq_bridge_generation`. The registry is
    the one its beat uses (`repeat_for`: `emq_bridge_redis_url` or a Redis broker, under
    `emq_bridge_prefix`), None when the app names no Redis; the longest sleep is
    `beat_max_loop_interval` when set.
    """
    from celery.app.utils import find_app

    try:
        app = find_app(spec)
    except EmqError as exc:  # a @recurring declaration, say: its reason, and where
        raise declared_at(exc) from exc
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the Celery app {spec!r}: {exc}") from exc
    except Exception as exc:  # the app's own code failed
        raise app_failed(f"cannot load the Celery app {spec!r}", exc) from exc
    if not isinstance(app, Celery):
        raise ConfigError(f"{spec!r} is {type(app).__name__}, not a Celery app")
    try:  # its task modules: a Django project's settings and tasks run here
        app.loader.import_default_modules()
    except EmqError as exc:
        raise declared_at(exc) from exc
    except Exception as exc:
        raise app_failed(f"cannot load the Celery app {spec!r}", exc) from exc
    app.finalize(auto=True)
    plan = app_schedule(app)
    dispatcher = PipelinedCeleryDispatcher(app) if pipelined else CeleryDispatcher(app)
    max_loop_s = app.conf.get("beat_max_loop_interval")
    return PumpTarget(
        dispatcher,
        plan.queues,
        plan.declarations,
        plan.source,
        plan.resolve_cadence,
        repeat=_beat_registry(app),
        registry_missing=_registry_missing(app),
        registry_prefix=registry_prefix(app),
        max_sleep_s=float(max_loop_s) if max_loop_s else None,
        history_size=history_size_setting(app),
        sync=lambda repeat: sync_app(app, repeat, plan, stamp=True),
    )


def _registry_missing(app: Celery) -> str | None:
    """Why the app names no Redis for its registry (the beat refuses to start), or None."""
    try:
        registry_url(app)
    except ConfigError as exc:
        return str(exc)
    return None


def _beat_registry(app: Celery) -> Repeat | None:
    """Return the registry the app's beat would use, or None if the app names no Redis."""
    try:
        registry_url(app)
    except ConfigError:
        return None  # the beat cannot run without one: the command's registry is the only one
    return repeat_for(app)  # a malformed emq_bridge_redis_url raises, as it does for the beat
