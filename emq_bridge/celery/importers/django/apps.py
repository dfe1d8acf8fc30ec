"""The Django app that adds `manage.py emq_import`."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-untyped]


class EmqImportConfig(AppConfig):  # type: ignore[misc]
    name = "emq_bridge.celery.importers.django"
    label = "emq_bridge_migrate"
    verbose_name = "emq-bridge import"
