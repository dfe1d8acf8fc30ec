"""How messages name a Celery setting of emq-bridge's: `setting_name`."""

from __future__ import annotations

from celery import Celery

__all__ = ["setting_name"]


def setting_name(app: Celery, name: str) -> str:
    """`name` as messages give it: with the name it has in the settings module too when the
    app reads one under a namespace (`config_from_object(..., namespace="CELERY")`, a Django
    project: `CELERY_EMQ_BRIDGE_REPORT`)."""
    namespace = getattr(app, "namespace", None)
    if isinstance(namespace, str) and namespace:
        return f"{name} ({namespace}_{name.upper()} in the settings)"
    return name
