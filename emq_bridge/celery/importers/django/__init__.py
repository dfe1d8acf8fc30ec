"""The django-celery-beat importer, and a tiny Django app that runs it in your project.

Add `"emq_bridge.celery.importers.django"` to `INSTALLED_APPS` (beside `"django_celery_beat"`)
and run `python manage.py emq_import --redis-url redis://...`; or, outside the project,
`emq-bridge import django-celery-beat --database-url postgresql://...`. The app has no
models and no migrations: it only adds the command. Celery side (it reads Celery schedules).
"""
