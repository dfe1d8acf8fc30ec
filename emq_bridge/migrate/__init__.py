"""Switching schedulers without losing a schedule: import, export.

* `plan` (core): an import as data (`ImportPlan`: each entry's declaration, the slot it
  fires next, its state and counters; what could not be carried, with the reason), and
  `apply_import`, which upserts it under the importer's own source; a re-run writes nothing.
* `export` (core): the registry written back as a schedule file (`emq-bridge sync` reads it).
* The celery-redbeat and django-celery-beat importers read Celery schedule objects, so
  they are part of the Celery adapter: `emq_bridge.celery.importers`.
"""
