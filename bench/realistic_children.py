"""The processes of `python -m bench.realistic`, each run as its program runs.

* `beat`: `celery beat -S emq`: `RepeatScheduler(app)` built as `celery.beat.Service`
  builds it (`lazy=False`: its `setup_schedule` converts and syncs `beat_schedule`), then
  the loop of `Service.start` (`interval = scheduler.tick()`, sleep, sync when due).
* `dramatiq-worker`: a real `dramatiq.Worker` with `RecurringMiddleware` on the broker;
  the middleware starts its pump thread at worker boot. The worker consumes no bench queue
  (the bench counts the messages in the broker).
* `pump`: `Pump.run` with a dispatcher, optionally timing each hand-over (the sustained
  scenario: `(sent - nominal)` per occurrence at the dispatch boundary).

Each child builds everything (untimed), sends one warm-up message the bench clears, sets
`ready`, waits for `go`, then runs until killed (or for `seconds`, then reports).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

import redis

from emq_bridge.events import PumpEvents
from emq_bridge.occurrence import Occurrence

from .brokers import db_url, dramatiq_broker, emq_dispatcher
from .common import DB_REGISTRY, QUEUE, TASK, TEMPLATE, count_client_traffic
from .realistic_workload import emq_app, template_of
from .scenarios import _CTX, Child
from .systems import EMQ_PREFIX

UNCONSUMED = "bench-unconsumed"  # the only queue the Dramatiq worker consumes: none is sent


class Proc(Child):
    """A `Child` (ready/go, shared traffic counters, a result pipe) running `job(params)`."""

    def __init__(self, job: str, params: dict[str, Any]) -> None:
        self.ready = _CTX.Event()
        self.go = _CTX.Event()
        self.trips: Any = _CTX.Value("q", 0, lock=False)
        self.commands: Any = _CTX.Value("q", 0, lock=False)
        self.receive, send = _CTX.Pipe(duplex=False)
        self.process = _CTX.Process(
            target=proc_main,
            args=(job, params, self.ready, self.go, (self.trips, self.commands), send),
            daemon=True,
        )
        self.process.start()
        send.close()
        self.at_go = (0, 0)


def start_procs(jobs: list[tuple[str, dict[str, Any]]], timeout_s: float = 300.0) -> list[Proc]:
    procs = [Proc(job, params) for job, params in jobs]
    try:
        for proc in procs:
            proc.wait_ready(timeout_s)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    return procs


def proc_main(
    job: str,
    params: dict[str, Any],
    ready: Event,
    go: Event,
    shared: tuple[Synchronized[int], Synchronized[int]],
    results: Connection,
) -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("celery").setLevel(logging.ERROR)
    count_client_traffic(shared)
    try:
        JOBS[job](params, ready, go, results)
    except BaseException as exc:
        results.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


def _warm_up_occurrence() -> Occurrence:
    return Occurrence(QUEUE, "warm-up", 0, str(uuid.uuid4()), TEMPLATE, 0)


def _beat(params: dict[str, Any], ready: Event, go: Event, results: Connection) -> None:
    from emq_bridge.celery import RepeatScheduler

    app = emq_app(
        params["url"],
        params["n"],
        identical=params.get("identical", False),
        pipelined=params.get("pipelined", False),
        report=params.get("report", True),
    )
    # As celery.beat.Service.get_scheduler builds it: setup_schedule converts and syncs.
    scheduler = RepeatScheduler(app=app, lazy=False)
    assert scheduler.pump is not None
    scheduler.pump.dispatcher.dispatch(_warm_up_occurrence())  # a running beat has sent
    ready.set()
    go.wait()
    while True:  # celery.beat.Service.start
        interval = scheduler.tick()
        if interval and interval > 0.0:
            time.sleep(interval)
            if scheduler.should_sync():
                scheduler._do_sync()


def _dramatiq_worker(params: dict[str, Any], ready: Event, go: Event, results: Connection) -> None:
    from dramatiq import Worker

    from emq_bridge import Repeat
    from emq_bridge.dramatiq import RecurringMiddleware

    url = params["url"]
    broker = dramatiq_broker(url)
    repeat = Repeat(redis.Redis.from_url(db_url(url, DB_REGISTRY)), EMQ_PREFIX)
    middleware = RecurringMiddleware(
        repeat,
        source="bench-dramatiq",  # declares nothing: its boot sync owns no bench schedule
        pump_queues=[QUEUE],
        pipelined=params.get("pipelined"),  # None: the default (automatic) choice
        report=params.get("report", True),
    )
    broker.add_middleware(middleware)
    broker.enqueue(broker.get_actor(TASK).message(0, 2))  # a running worker has sent
    repeat.server_time_ms()
    ready.set()
    go.wait()
    worker = Worker(broker, queues={UNCONSUMED}, worker_threads=1)
    worker.start()  # before_worker_boot syncs, after_worker_boot starts the pump thread
    threading.Event().wait()


class LagRecorder:
    """Wrap a dispatcher: record (nominal due, sent - nominal) per occurrence, in ms."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.due: list[int] = []
        self.lag: list[float] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        self.inner.dispatch(occurrence)
        self.due.append(occurrence.due_ms)
        self.lag.append(time.time() * 1000 - occurrence.due_ms)


class BatchLagRecorder(LagRecorder):
    """The same for a dispatcher with the `dispatch_batch` fast path."""

    def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> Sequence[BaseException | None]:
        errors = self.inner.dispatch_batch(occurrences)
        at = time.time() * 1000
        for occurrence, error in zip(occurrences, errors, strict=True):
            if error is None:
                self.due.append(occurrence.due_ms)
                self.lag.append(at - occurrence.due_ms)
        return errors  # type: ignore[no-any-return]


def _pump(params: dict[str, Any], ready: Event, go: Event, results: Connection) -> None:
    from emq_bridge import Pump, Repeat

    url = params["url"]
    dispatcher, _ = emq_dispatcher(params["path"], url)
    warm = _warm_up_occurrence()
    if params["path"].startswith("dramatiq"):
        warm = Occurrence(QUEUE, "warm-up", 0, str(uuid.uuid4()), template_of(0), 0)
    dispatcher.dispatch(warm)
    seconds = params.get("seconds")
    recorder: LagRecorder | None = None
    if seconds is not None:
        batch = callable(getattr(dispatcher, "dispatch_batch", None))
        recorder = BatchLagRecorder(dispatcher) if batch else LagRecorder(dispatcher)
    repeat = Repeat(redis.Redis.from_url(db_url(url, DB_REGISTRY)), EMQ_PREFIX)
    claims = ClaimCounter(repeat)
    pump = Pump(repeat, params.get("queues", [QUEUE]), recorder or dispatcher, listeners=[claims])
    repeat.server_time_ms()
    ready.set()
    go.wait()
    if seconds is not None:
        threading.Timer(seconds, pump.stop).start()
    cpu_s = time.process_time()
    pump.run()
    cpu_s = time.process_time() - cpu_s
    if recorder is not None:
        results.send(
            {
                "due": recorder.due,
                "lag": recorder.lag,
                "cpu_s": cpu_s,
                "scanned": claims.scanned,
                "claimed": claims.claimed,
            }
        )


class ClaimCounter(PumpEvents):
    """Count what a pump's scans found due and what its claims took of it: with several
    pumps on one queue, the rest went to another pump's claim (read and offered, not sent)."""

    def __init__(self, repeat: Any) -> None:
        self.scanned = 0
        self.claimed = 0
        scan, scan_many = repeat.scan, repeat.scan_many

        def counted_scan(*args: Any, **kwargs: Any) -> Any:
            found = scan(*args, **kwargs)
            self.scanned += len(found.due)
            return found

        def counted_scan_many(*args: Any, **kwargs: Any) -> Any:
            found = scan_many(*args, **kwargs)
            self.scanned += sum(len(f.due) for f in found if hasattr(f, "due"))
            return found

        repeat.scan, repeat.scan_many = counted_scan, counted_scan_many

    def on_claim(self, queue: str, batch: Sequence[Occurrence]) -> None:
        self.claimed += len(batch)


JOBS = {"beat": _beat, "dramatiq-worker": _dramatiq_worker, "pump": _pump}


def in_child(function: Any, *args: Any, timeout_s: float = 900.0) -> Any:
    """Run `function(*args)` in a forked process; return what it returns (picklable).

    For what must not leave state in the bench process: `@recurring`'s process-wide list,
    a million declarations' memory.
    """
    receive, send = _CTX.Pipe(duplex=False)

    def target() -> None:
        logging.getLogger("celery").setLevel(logging.ERROR)
        count_client_traffic()
        try:
            send.send(("ok", function(*args)))
        except BaseException as exc:
            send.send(("error", f"{type(exc).__name__}: {exc}"))
            raise

    process = _CTX.Process(target=target, daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise RuntimeError(f"{getattr(function, '__name__', function)} sent nothing")
        status, value = receive.recv()
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
        receive.close()
    if status != "ok":
        raise RuntimeError(f"child failed: {value}")
    return value
