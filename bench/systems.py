"""The systems under test, each behind the same small interface.

* `Emq`: emq-bridge (`sync` of declarations, `Pump` with the Celery or Dramatiq adapter).
* `RedBeat`: celery-redbeat's `RedBeatScheduler`, driven the way `celery beat` drives it.
* `Persistent`: Celery's built-in `PersistentScheduler` (a shelve file), driven the same way.

The scheduler loops run in child processes (see `child.py`); set-up, sync, memory and the
idle tick run in the bench process. Every system gets the same schedules: `name_of(i)`,
every hour, the template in `common.TEMPLATE`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import redis

from emq_bridge import Repeat
from emq_bridge.definition import define
from emq_bridge.keys import QueueKeys
from emq_bridge.sync import Declaration, sync

from .brokers import celery_app, db_url
from .common import ARGS, DB_REGISTRY, EVERY_S, KWARGS, QUEUE, TASK, TEMPLATE, name_of

EMQ_PREFIX = "emq"
REDBEAT_PREFIX = "redbeat:"
SOURCE = "bench"


class System:
    """What the scenarios ask of a system."""

    label = ""
    path = "celery"
    minimal = False  # sync the task-only template instead of the bench's standard one

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(db_url(url, DB_REGISTRY))

    def sync(self, n: int, every_s: int = EVERY_S) -> None:
        """Declare schedules 0..n-1 (every `every_s`) and sync them into the store."""
        raise NotImplementedError

    def record_key(self) -> str | None:
        """Return the Redis key holding schedule 0, for MEMORY USAGE (None: not in Redis)."""
        return None

    def make_due(self, n: int, due_ms: int, spread_ms: float = 0.0) -> None:
        """Make schedule i due at `due_ms + i * spread_ms` (the same instant when 0)."""
        raise NotImplementedError

    def make_idle(self, n: int) -> None:
        """Make every schedule next due an hour from now."""
        raise NotImplementedError

    def idle_tick(self) -> Any:
        """Run one tick with nothing due; return whatever the tick returns."""
        raise NotImplementedError

    def add_runtime(self, name: str, due_ms: int) -> None:
        """Add an hourly schedule at runtime whose first slot is `due_ms`."""
        raise NotImplementedError

    def close(self) -> None:
        self.client.close()


# -- emq-bridge -------------------------------------------------------------------------


def emq_declarations(n: int, every_s: int = EVERY_S, minimal: bool = False) -> list[Declaration]:
    template = {"task": TASK} if minimal else TEMPLATE
    definition = define(every_ms=every_s * 1000, template=template)
    return [Declaration(QUEUE, name_of(i), definition) for i in range(n)]


class Emq(System):
    label = "emq-bridge"

    def __init__(self, url: str, path: str = "celery") -> None:
        super().__init__(url)
        self.path = path
        self.repeat = Repeat(self.client, EMQ_PREFIX)
        self.keys = QueueKeys(EMQ_PREFIX, QUEUE)
        self._pump: Any = None

    def sync(self, n: int, every_s: int = EVERY_S) -> None:
        sync(self.repeat, emq_declarations(n, every_s, self.minimal), SOURCE)

    def record_key(self) -> str:
        return self.keys.record(name_of(0))

    def make_due(self, n: int, due_ms: int, spread_ms: float = 0.0) -> None:
        pipe = self.client.pipeline(transaction=False)
        for i in range(n):
            pipe.zadd(self.keys.registry, {name_of(i): due_ms + int(i * spread_ms)}, xx=True)
            if i % 5000 == 4999:
                pipe.execute()
        pipe.delete(self.keys.leases)
        pipe.execute()

    def make_idle(self, n: int) -> None:
        self.make_due(n, int(time.time() * 1000) + EVERY_S * 1000)

    def pump(self) -> Any:
        from emq_bridge import Pump

        from .child import NullDispatcher

        if self._pump is None:
            self._pump = Pump(self.repeat, [QUEUE], NullDispatcher())
        return self._pump

    def idle_tick(self) -> Any:
        tick = self.pump().run_once()
        if tick.dispatched:
            raise AssertionError("idle tick dispatched something: the set-up is wrong")
        return tick

    def add_runtime(self, name: str, due_ms: int) -> None:
        # An hourly schedule registered "an hour minus 100 ms ago", anchored on that instant
        # (not the hour grid): its first slot is due_ms.
        self.repeat.register(
            QUEUE,
            name,
            every_ms=EVERY_S * 1000,
            anchor="schedule",
            template=TEMPLATE,
            now_ms=due_ms - EVERY_S * 1000,
        )


# -- celery-redbeat ---------------------------------------------------------------------


def beat_schedule(
    n: int, last_run_at: datetime | None = None, every_s: int = EVERY_S, minimal: bool = False
) -> dict[str, dict[str, Any]]:
    """Return Celery's `beat_schedule` for schedules 0..n-1, every `every_s`, the bench task.

    `minimal`: the task name alone (no args, kwargs or options).
    """
    from celery.schedules import schedule

    every = schedule(timedelta(seconds=every_s))
    entry: dict[str, Any] = {"task": TASK, "schedule": every}
    if not minimal:
        entry.update({"args": ARGS, "kwargs": KWARGS, "options": {"queue": QUEUE}})
    if last_run_at is not None:
        entry["last_run_at"] = last_run_at
    return {name_of(i): dict(entry) for i in range(n)}


def redbeat_app(
    url: str, n: int = 0, every_s: int = EVERY_S, minimal: bool = False, **conf: Any
) -> Any:
    """Return a Celery app configured for RedBeat on the bench server (registry database)."""
    return celery_app(
        url,
        redbeat_redis_url=db_url(url, DB_REGISTRY),
        redbeat_key_prefix=REDBEAT_PREFIX,
        beat_schedule=beat_schedule(n, every_s=every_s, minimal=minimal),
        **conf,
    )


def redbeat_scheduler(app: Any, lazy: bool) -> Any:
    """Build RedBeatScheduler as `celery beat` does, and take its lock as `beat_init` does."""
    from redbeat.schedulers import (  # type: ignore[import-untyped]
        RedBeatScheduler,
        acquire_distributed_beat_lock,
    )

    scheduler = RedBeatScheduler(app=app, lazy=lazy)
    acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=scheduler))
    return scheduler


class RedBeat(System):
    label = "celery-redbeat"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._scheduler: Any = None
        self._n = 0
        self._every_s = EVERY_S

    def sync(self, n: int, every_s: int = EVERY_S) -> None:
        # `celery beat` builds the scheduler (setup_schedule stores beat_schedule) at start.
        from redbeat.schedulers import RedBeatScheduler

        self._close()
        app = redbeat_app(self.url, n, every_s, self.minimal)
        RedBeatScheduler(app=app, lazy=False)
        self._n, self._every_s = n, every_s

    def record_key(self) -> str:
        return f"{REDBEAT_PREFIX}{name_of(0)}"

    def _write_meta(self, n: int, last_run: float, spread_s: float) -> None:
        from redbeat.decoder import RedBeatJSONEncoder  # type: ignore[import-untyped]

        schedule_key = f"{REDBEAT_PREFIX}:schedule"
        pipe = self.client.pipeline(transaction=False)
        for i in range(n):
            at = last_run + i * spread_s
            meta = json.dumps(
                {"last_run_at": datetime.fromtimestamp(at, timezone.utc)}, cls=RedBeatJSONEncoder
            )
            key = f"{REDBEAT_PREFIX}{name_of(i)}"
            pipe.hset(key, "meta", meta)
            # RedBeat's own score: the due time in whole seconds (to_timestamp).
            pipe.zadd(schedule_key, {key: int(at + self._every_s)})
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()

    def make_due(self, n: int, due_ms: int, spread_ms: float = 0.0) -> None:
        self._write_meta(n, due_ms / 1000 - self._every_s, spread_ms / 1000)

    def make_idle(self, n: int) -> None:
        self._write_meta(n, time.time(), 0.0)

    def idle_tick(self) -> Any:
        if self._scheduler is None:
            self._scheduler = redbeat_scheduler(
                redbeat_app(self.url, self._n, self._every_s), lazy=True
            )
        return self._scheduler.tick()

    def add_runtime(self, name: str, due_ms: int) -> None:
        from celery.schedules import schedule
        from redbeat.schedulers import RedBeatSchedulerEntry

        app = redbeat_app(self.url, self._n, self._every_s)
        last = datetime.fromtimestamp(due_ms / 1000 - EVERY_S, timezone.utc)
        RedBeatSchedulerEntry(
            name,
            TASK,
            schedule(timedelta(seconds=EVERY_S)),
            args=ARGS,
            kwargs=KWARGS,
            options={"queue": QUEUE},
            app=app,
            last_run_at=last,
        ).save()

    def _close(self) -> None:
        if self._scheduler is not None:
            if self._scheduler.lock is not None:
                self._scheduler.close()
            self._scheduler = None

    def close(self) -> None:
        self._close()
        super().close()


# -- Celery's PersistentScheduler -------------------------------------------------------


class Persistent(System):
    label = "celery PersistentScheduler"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.directory = tempfile.mkdtemp(prefix="bench-beat-")
        self.filename = os.path.join(self.directory, "celerybeat-schedule")
        self._scheduler: Any = None
        self._n = 0

    def sync(self, n: int, every_s: int = EVERY_S) -> None:
        from celery.beat import PersistentScheduler

        self._close()
        app = celery_app(self.url, beat_schedule=beat_schedule(n, every_s=every_s))
        self._scheduler = PersistentScheduler(app=app, schedule_filename=self.filename, lazy=False)
        self._n = n

    def idle_tick(self) -> Any:
        return self._scheduler.tick()

    def wipe(self) -> None:
        self._close()
        for name in os.listdir(self.directory):
            os.remove(os.path.join(self.directory, name))

    def file_bytes(self) -> int:
        return sum(
            os.path.getsize(os.path.join(self.directory, f)) for f in os.listdir(self.directory)
        )

    def _close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None

    def close(self) -> None:
        self._close()
        shutil.rmtree(self.directory, ignore_errors=True)
        super().close()
