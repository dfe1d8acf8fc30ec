"""The registry a Django project's import goes to: its Celery app's, as its beat reads it.

Shared by `python manage.py emq_import` and `DJANGO_SETTINGS_MODULE=... emq-bridge import
django-celery-beat`, so that what either imports is what the project's beat and pumps pump.
"""

from __future__ import annotations

from celery import Celery, current_app

from emq_bridge.celery.declare import registry_prefix, registry_url
from emq_bridge.errors import ConfigError
from emq_bridge.keys import DEFAULT_PREFIX

__all__ = ["project_registry"]


def project_registry(url: str | None, prefix: str | None) -> tuple[str, str]:
    """The registry to import into: what the options name, else the project's Celery app's
    (`current_app`: the app its `celery.py` made), as its beat and pumps read it, so that
    what is imported is what they pump. `ConfigError` when neither names a Redis."""
    app = current_app._get_current_object()
    if url is None:
        try:
            url = registry_url(app)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; or give --redis-url") from None
    if prefix is None:
        prefix = registry_prefix(app) if isinstance(app, Celery) else DEFAULT_PREFIX
    return url, prefix
