"""The scheduler loops, each in its own process, started by the bench and killed when done.

A child builds its scheduler (untimed), sets `ready`, waits for `go`, then loops exactly
as its program would: emq-bridge's `Pump.run`, or the loop of `celery beat`'s
`Service.start` (`interval = scheduler.tick()`, sleep, sync when due) around RedBeat's or
Celery's scheduler. Round trips and commands the child sends are mirrored into shared
counters. In `lag` mode the child times each hand-over to the broker and reports
`(accepted_at - nominal_due)` for every occurrence when its time is up.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

import redis

from emq_bridge.registry import Occurrence

from .brokers import celery_app, db_url, emq_dispatcher
from .common import ARGS, DB_REGISTRY, KWARGS, QUEUE, TASK, TEMPLATE, count_client_traffic


class NullDispatcher:
    """Refuse every occurrence: the idle tick uses it, and there nothing may be due."""

    def dispatch(self, occurrence: Occurrence) -> None:
        raise AssertionError(f"nothing should be due, but {occurrence.name} was")


class TimingDispatcher:
    """Wrap a dispatcher; record (accepted_at - due) in ms for each occurrence."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lags: list[float] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        self.inner.dispatch(occurrence)
        self.lags.append(time.time() * 1000 - occurrence.due_ms)


class TimingBatchDispatcher(TimingDispatcher):
    """The same for a dispatcher with the opt-in `dispatch_batch` fast path."""

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> Sequence[BaseException | None]:
        errors = self.inner.dispatch_batch(occurrences)
        at = time.time() * 1000
        pairs = zip(occurrences, errors, strict=True)
        self.lags.extend(at - o.due_ms for o, e in pairs if e is None)
        return errors  # type: ignore[no-any-return]


def timing(dispatcher: Any) -> TimingDispatcher:
    """Wrap `dispatcher` so that it records lags, keeping its fast path if it has one."""
    if callable(getattr(dispatcher, "dispatch_batch", None)):
        return TimingBatchDispatcher(dispatcher)
    return TimingDispatcher(dispatcher)


@dataclass
class ChildSpec:
    """What a child runs."""

    system: str  # emq | redbeat | persistent
    url: str
    path: str = "celery"  # emq only: celery | celery-pipelined | dramatiq | dramatiq-pipelined
    mode: str = "run"  # run (until killed) | lag (for `seconds`, then report)
    seconds: float = 0.0
    batch_size: int = 500
    beat_file: str = ""  # persistent only
    beat_schedule_n: int = 0  # persistent only: entries to load
    beat_last_run: float = 0.0  # persistent only: last_run_at of entry 0 (epoch s), 0: now
    beat_spread_s: float = 0.0  # persistent only: last_run_at step between entries
    beat_every_s: int = 3600  # persistent only: the interval of every entry
    redbeat_n: int = 0  # redbeat only: how many static entries the app declares


def child_main(
    spec: ChildSpec,
    ready: Event,
    go: Event,
    shared: tuple[Synchronized[int], Synchronized[int]],
    results: Connection,
) -> None:
    """Entry point of a child process."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("celery").setLevel(logging.ERROR)
    count_client_traffic(shared)
    try:
        if spec.system == "emq":
            _run_emq(spec, ready, go, results)
        else:
            _run_beat(spec, ready, go, results)
    except BaseException as exc:
        results.send({"error": f"{type(exc).__name__}: {exc}", "pid": os.getpid()})
        raise


def _run_emq(spec: ChildSpec, ready: Event, go: Event, results: Connection) -> None:
    from emq_bridge import Pump, Repeat

    from .systems import EMQ_PREFIX

    dispatcher, _ = emq_dispatcher(spec.path, spec.url)
    # A running pump has sent before: connect and declare with one message the bench clears.
    dispatcher.dispatch(Occurrence(QUEUE, "warm-up", 0, str(uuid.uuid4()), TEMPLATE, 0))
    timed = timing(dispatcher) if spec.mode == "lag" else None
    repeat = Repeat(redis.Redis.from_url(db_url(spec.url, DB_REGISTRY)), EMQ_PREFIX)
    pump = Pump(repeat, [QUEUE], timed or dispatcher, batch_size=spec.batch_size)
    repeat.server_time_ms()  # connect before the clock starts
    ready.set()
    go.wait()
    if spec.mode == "lag":
        threading.Timer(spec.seconds, pump.stop).start()
    pump.run()
    if timed is not None:
        results.send({"lags": timed.lags})


def _instrumented(cls: Any, lags: list[float]) -> Any:
    """Subclass a Celery scheduler to time each hand-over, changing nothing else."""

    class Timed(cls):  # type: ignore[misc]
        def apply_async(
            self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
        ) -> Any:
            due = entry.last_run_at + entry.schedule.run_every
            result = super().apply_async(entry, producer, advance, **kwargs)
            lags.append((time.time() - due.timestamp()) * 1000)
            return result

    return Timed


def _run_beat(spec: ChildSpec, ready: Event, go: Event, results: Connection) -> None:
    lags: list[float] = []
    if spec.system == "redbeat":
        from redbeat.schedulers import (  # type: ignore[import-untyped]
            RedBeatScheduler,
            acquire_distributed_beat_lock,
        )

        from .systems import redbeat_app

        app = redbeat_app(spec.url, spec.redbeat_n)
        cls = _instrumented(RedBeatScheduler, lags) if spec.mode == "lag" else RedBeatScheduler
        # The entries are in Redis already (the sync scenario stored them): no setup here.
        scheduler = cls(app=app, lazy=True)
        from types import SimpleNamespace

        acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=scheduler))
    else:
        from celery.beat import PersistentScheduler

        from .systems import beat_schedule

        schedule = beat_schedule(spec.beat_schedule_n, every_s=spec.beat_every_s)
        if spec.beat_last_run:
            base = datetime.fromtimestamp(spec.beat_last_run, timezone.utc)
            for i, entry in enumerate(schedule.values()):
                entry["last_run_at"] = base + timedelta(seconds=i * spec.beat_spread_s)
        app = celery_app(spec.url, beat_schedule=schedule)
        cls = (
            _instrumented(PersistentScheduler, lags) if spec.mode == "lag" else PersistentScheduler
        )
        scheduler = cls(app=app, schedule_filename=spec.beat_file, lazy=False)
    # A running beat has sent before: connect and declare with one message the bench clears.
    app.tasks[TASK].apply_async(ARGS, KWARGS, producer=scheduler.producer, queue=QUEUE)
    ready.set()
    go.wait()
    deadline = time.monotonic() + spec.seconds if spec.mode == "lag" else None
    # celery.beat.Service.start, with a deadline.
    while deadline is None or time.monotonic() < deadline:
        interval = scheduler.tick()
        if interval and interval > 0.0:
            if deadline is not None:
                interval = min(interval, max(0.0, deadline - time.monotonic()))
            time.sleep(interval)
            if scheduler.should_sync():
                scheduler._do_sync()
    results.send({"lags": lags})
