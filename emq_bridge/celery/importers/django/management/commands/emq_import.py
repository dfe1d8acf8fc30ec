"""`python manage.py emq_import`: import django-celery-beat's periodic tasks into emq-bridge."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError  # type: ignore[import-untyped]

from emq_bridge.celery.importers.django.project import project_registry
from emq_bridge.celery.importers.django.reader import DEFAULT_SOURCE, read_periodic_tasks
from emq_bridge.errors import EmqError
from emq_bridge.migrate.plan import apply_import, left_behind_notes, queues_note, result_lines
from emq_bridge.registry import Repeat
from emq_bridge.urls import redact_url


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Import django-celery-beat's periodic tasks into the emq-bridge registry "
        "(re-running it changes nothing)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--redis-url",
            help="The emq-bridge registry (default: the Celery app's, as its beat reads it).",
        )
        parser.add_argument(
            "--prefix", help="Its key prefix (default: the app's emq_bridge_prefix, else emq)."
        )
        parser.add_argument("--database", default="default", help="The database alias to read.")
        parser.add_argument("--queue", default="celery", help="Queue of tasks naming none.")
        parser.add_argument("--source", default=DEFAULT_SOURCE, help="Owner tag of the imports.")
        parser.add_argument("--dry-run", action="store_true", help="Print the plan; write nothing.")
        parser.add_argument(
            "--strict", action="store_true", help="Write nothing if any task cannot be imported."
        )
        parser.add_argument(
            "--paused", action="store_true", help="Create the registrations paused (staging)."
        )
        parser.add_argument(
            "--resume",
            action="store_true",
            help="Cut-over (django-celery-beat's beat stopped): resume what is enabled there.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            url, prefix = project_registry(options["redis_url"], options["prefix"])
            if options["redis_url"] is None or options["prefix"] is None:  # the app's: say so
                self.stderr.write(f"registry: {redact_url(url)} (prefix {prefix!r})")
            with Repeat.from_url(url, prefix) as repeat:
                plan = read_periodic_tasks(
                    now_ms=repeat.server_time_ms(),
                    using=options["database"],
                    queue=options["queue"],
                    source=options["source"],
                )
                result = apply_import(
                    repeat,
                    plan,
                    dry_run=options["dry_run"],
                    strict=options["strict"],
                    paused=options["paused"],
                    resume=options["resume"],
                )
                behind = left_behind_notes(repeat, plan)
        except EmqError as exc:
            raise CommandError(str(exc)) from exc
        for line in result_lines(result):
            self.stdout.write(line)
        note = queues_note(result)  # which queues a beat must pump, as the CLI says
        if note is not None:
            self.stderr.write(note)
        for line in behind:
            self.stderr.write(line)
        self.stderr.write(result.summary())
