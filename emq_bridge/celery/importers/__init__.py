"""The celery-redbeat and django-celery-beat importers: they read Celery schedule objects.

Part of the Celery adapter, so the core never imports Celery: `schedules` turns one Celery
schedule into a cadence and its next slot, `redbeat` reads celery-redbeat's entries, and
`django` is a small Django app (`manage.py emq_import`) reading django-celery-beat's rows.
Each returns an `emq_bridge.migrate.plan.ImportPlan` (core), which `apply_import` upserts;
the `emq-bridge import` commands import these modules only when they run.
"""
