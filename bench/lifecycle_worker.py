"""The worker side of `python -m bench.lifecycle`: a real Celery app and a real Dramatiq broker.

`bench.lifecycle` starts real worker processes on this module (`celery -A
bench.lifecycle_worker:app worker ...`, `dramatiq bench.lifecycle_worker ...`) and reads what
each process measured from a small JSON file it rewrites (`$LC_STATS/<pid>.json`), so the
measurement sends nothing to Redis and nothing to the worker's own broker.

Environment:

* `LC_URL`: the bench server (`redis://host:port/0`); the registry is database 0, Celery's
  broker database 1, Dramatiq's broker database 2 (as in the rest of the bench);
* `LC_PREFIX`: the registry's key prefix;
* `LC_REPORT`: `on` or `off`, the adapters' worker-side reporting (Celery's
  `emq_bridge_report` setting, `RecurringMiddleware(report=...)`);
* `LC_STATS`: the folder of the per-process stats files;
* `LC_WORKER`: `celery` (the module defines `app`) or `dramatiq` (it sets the broker).

Per process it counts the tasks run (the first start and the last finish, wall clock), the
`Repeat.report` calls that returned and the reports they carried (heartbeats apart), and the
round trips (socket writes) to the registry's database: with the brokers in other databases,
those are exactly the round trips reporting costs the worker.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import redis.connection

from emq_bridge.lifecycle import LifecycleMoves

from .brokers import db_url
from .common import DB_CELERY, DB_DRAMATIQ, DB_REGISTRY, QUEUE, TASK

URL = os.environ.get("LC_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("LC_PREFIX", "lc")
REPORT = os.environ.get("LC_REPORT", "off") == "on"
# Without it (the module imported by hand), nothing is written.
STATS_DIR = Path(os.environ["LC_STATS"]) if os.environ.get("LC_STATS") else None
REGISTRY_URL = db_url(URL, DB_REGISTRY)
# Each process rewrites its stats file at most this often (and once more when it changes).
WRITE_EVERY_S = 0.02


# -- per-process measurement, sent nowhere but a local file ----------------------------------


class Stats:
    """What this process did: tasks, report calls, reports, registry round trips."""

    def __init__(self) -> None:
        self.pid = -1
        self.lock = threading.Lock()

    def _fresh(self) -> None:
        # A forked child (Celery's prefork pool) starts from zero, with its own writer.
        self.pid = os.getpid()
        self.tasks = 0
        self.first_start = 0.0
        self.last_finish = 0.0
        self.report_calls = 0
        self.reports = 0
        self.outcome_reports = 0
        self.registry_round_trips = 0
        self.version = 0
        self.written = -1
        if STATS_DIR is not None:
            threading.Thread(target=self._write_loop, name="lc-stats", daemon=True).start()

    def _here(self) -> None:
        if self.pid != os.getpid():
            with self.lock:
                if self.pid != os.getpid():
                    self._fresh()

    def task(self, started: float, finished: float) -> None:
        self._here()
        with self.lock:
            if not self.tasks:
                self.first_start = started
            self.tasks += 1
            self.last_finish = max(self.last_finish, finished)
            self.version += 1

    def report_call(self, items: int, outcomes: int) -> None:
        self._here()
        with self.lock:
            self.report_calls += 1
            self.reports += items
            self.outcome_reports += outcomes
            self.version += 1

    def round_trip(self) -> None:
        if self.pid == os.getpid():  # counted once this process runs tasks
            with self.lock:
                self.registry_round_trips += 1
                self.version += 1

    def _write_loop(self) -> None:
        assert STATS_DIR is not None
        pid = self.pid
        while pid == os.getpid():
            time.sleep(WRITE_EVERY_S)
            with self.lock:
                if self.version == self.written:
                    continue
                self.written = self.version
                payload = {
                    "pid": pid,
                    "tasks": self.tasks,
                    "first_start": self.first_start,
                    "last_finish": self.last_finish,
                    "report_calls": self.report_calls,
                    "reports": self.reports,
                    "outcome_reports": self.outcome_reports,
                    "registry_round_trips": self.registry_round_trips,
                }
            path = STATS_DIR / f"{pid}.json"
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(payload))
            temporary.replace(path)


STATS = Stats()


def _count_report_calls() -> None:
    """Count the `Repeat.report` calls the adapters make, and the reports they carry."""
    original: Any = LifecycleMoves.report

    def counted(self: Any, reports: Any, **options: Any) -> Any:
        reports = list(reports)
        applied = original(self, reports, **options)
        # Counted once applied, and without heartbeats: what the bench waits for. A final
        # report that carries its start (`Reporter` folds the two) counts for both.
        outcomes = sum((r.kind != "heartbeat") + (r.started_ms is not None) for r in reports)
        STATS.report_call(len(reports), outcomes)
        return applied

    LifecycleMoves.report = counted  # type: ignore[method-assign]


def _count_registry_round_trips() -> None:
    """Count socket writes to the registry's database (a command, or a whole pipeline)."""
    original: Any = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> Any:
        if getattr(self, "db", None) == DB_REGISTRY:
            STATS.round_trip()
        return original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


_count_report_calls()
_count_registry_round_trips()


def noop(*args: Any, **kwargs: Any) -> None:
    """The task: nothing but the bench's own two clock reads."""
    started = time.time()
    STATS.task(started, time.time())


# -- Celery ------------------------------------------------------------------------------------


def celery_app() -> Any:
    from celery import Celery

    # The adapter's signal receivers, connected on import (as an app using `@recurring`
    # does); they report only where `emq_bridge_report` is on.
    import emq_bridge.celery  # noqa: F401

    app = Celery("lifecycle", broker=db_url(URL, DB_CELERY), set_as_current=True)
    app.conf.update(
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        enable_utc=True,
        timezone="UTC",
        worker_hijack_root_logger=False,
        emq_bridge_redis_url=REGISTRY_URL,
        emq_bridge_prefix=PREFIX,
        emq_bridge_report=REPORT,
    )
    app.task(name=TASK)(noop)
    return app


# -- Dramatiq ----------------------------------------------------------------------------------


def dramatiq_broker() -> Any:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware

    broker_class: Any = RedisBroker
    broker = broker_class(url=db_url(URL, DB_DRAMATIQ))
    # The worker's middleware as a deployment has it, without the pump and the boot sync
    # (the bench's pump sent the occurrences before the worker started).
    middleware: Any = RecurringMiddleware
    broker.add_middleware(
        middleware(REGISTRY_URL, prefix=PREFIX, run_pump=False, sync_at_boot=False, report=REPORT)
    )
    dramatiq.set_broker(broker)
    declare: Any = dramatiq.actor
    declare(noop, actor_name=TASK, queue_name=QUEUE, broker=broker)
    return broker


# What the worker commands load: `celery -A bench.lifecycle_worker:app`, and
# `dramatiq bench.lifecycle_worker` (the broker set by `dramatiq.set_broker`).
WORKER = os.environ.get("LC_WORKER", "")
if WORKER == "celery":
    app = celery_app()
elif WORKER == "dramatiq":
    broker = dramatiq_broker()
