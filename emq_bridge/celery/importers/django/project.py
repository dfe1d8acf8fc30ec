"""The registry a Django project's import goes to: its Celery app's, as its beat reads it.

Shared by `python manage.py emq_import` and `DJANGO_SETTINGS_MODULE=... emq-bridge import
django-celery-beat`, so that what either imports is what the project's beat and pumps pump.
"""

from __future__ import annotations

import os

from celery import Celery, current_app
from celery import _state as celery_state

from emq_bridge.celery.declare import registry_prefix, registry_url
from emq_bridge.celery.setting_names import warn_unread_settings
from emq_bridge.errors import ConfigError
from emq_bridge.keys import DEFAULT_PREFIX

__all__ = ["project_registry"]


def project_registry(url: str | None, prefix: str | None) -> tuple[str, str]:
    """The registry to import into: what the options name, else the project's Celery app's
    (`current_app`: the app its `celery.py` made), as its beat and pumps read it, so that
    what is imported is what they pump. `ConfigError` when neither names a Redis, or when
    the project made no Celery app (Celery's fallback app, with none of its settings, would
    name another registry or prefix than its beat's)."""
    app = current_app._get_current_object()
    if url is None and _fallback(app):
        package = os.environ.get("DJANGO_SETTINGS_MODULE", "proj.settings").split(".")[0]
        raise ConfigError(
            "the project has no Celery app loaded, so its registry is unknown: does "
            f"{package}/__init__.py import it (from .celery import app as celery_app, as "
            "Celery's 'First steps with Django' has it)? Or give --redis-url (and --prefix)"
        )
    if isinstance(app, Celery):
        warn_unread_settings(app)
    if url is None:
        try:
            url = registry_url(app)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; or give --redis-url") from None
    if prefix is None:
        prefix = registry_prefix(app) if isinstance(app, Celery) else DEFAULT_PREFIX
    return url, prefix


def _fallback(app: object) -> bool:
    """Whether `app` is the app Celery makes when a program made none (`current_app` then)."""
    return (
        getattr(celery_state._tls, "current_app", None) is None
        and app is celery_state.default_app
        and getattr(app, "main", None) == "default"
    )
