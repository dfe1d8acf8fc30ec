"""`RecurringMiddleware`: sync declared schedules when a Dramatiq worker boots, and pump them.

Part of `emq_bridge.dramatiq`. At worker boot the middleware syncs the schedules
declared on the broker's actors (and a schedule file, if given) into the registry, then
starts a pump thread inside the worker, so a Dramatiq deployment needs no scheduler
process. Many workers booting at once converge: sync is a set of idempotent upserts, and
the pumps' claims are compare-and-set, so each occurrence is enqueued once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from ..bulk import without_gc
from ..config import load_schedule_file
from ..definition import Declaration
from ..errors import ConfigError, EmqError, RegistryUnavailable, ScheduleError
from ..events import PumpEvents
from ..file_stamp import FileStamp, file_stamp
from ..keys import DEFAULT_PREFIX, validate_name, validate_prefix
from ..lifecycle import check_history_size
from ..outcome import HISTORY_SIZE
from ..pump import STOP_DEADLINE_S, Pump
from ..pump_options import check_pump_options
from ..registry import Repeat, generation_arg
from ..reporting import HEARTBEAT_S, Reporter
from ..resync import RegistryWatch
from ..sync import Stamp, SyncPlan, check_one_source, sync
from .dispatch import PipelinedDramatiqDispatcher, dramatiq_dispatcher
from .outcomes import MessageOutcomes
from .schedule import (
    RECURRING_OPTION,
    actor_declarations,
    broker_declarations,
    check_actors,
    set_current_message,
)

__all__ = [
    "DEFAULT_SOURCE",
    "BootError",
    "RecurringMiddleware",
    "RecurringOptionError",
]

log = logging.getLogger(__name__)

DEFAULT_SOURCE = "dramatiq"
# After an unexpected pump failure the thread waits this long, then pumps again.
PUMP_RESTART_S = 1.0
# How long a stopping worker waits for its pump thread to settle the batch in hand: what
# `emq-bridge pump` and `celery beat -S emq` wait (`STOP_DEADLINE_S`). A thread still held
# then (a registry that stopped answering) is left: its leases expire as after a crash.
PUMP_JOIN_S = STOP_DEADLINE_S
# At shutdown the reports queued so far are sent within this long (then dropped).
REPORT_FLUSH_S = 5.0
# ... or within this long when Redis is known not to take them (the pump's outage, or a
# flush that timed out already): a worker stopping within Kubernetes' grace period (30 s)
# must not spend it on reports that cannot go.
REPORT_FLUSH_STUCK_S = 0.5
# A copy of a running occurrence comes back this long after its first copy's heartbeats
# would have lapsed (a pump marks it lost at its next scan past that deadline).
REDELIVER_MARGIN_MS = 1000


class BootError(EmqError, MiddlewareError):
    """Recurring schedules could not be set up when a Dramatiq worker booted.

    A `MiddlewareError`, so Dramatiq lets it stop the worker instead of logging it away;
    its `__cause__` is the underlying emq-bridge error (`RegistryUnavailable`, ...).
    """


class RecurringOptionError(ScheduleError, MiddlewareError):
    """An actor's `recurring=` option is invalid; raised when the actor is declared."""


def _address(client: Any) -> str:
    """Describe where a redis-py client connects, for error messages (never the password)."""
    try:
        options = client.connection_pool.connection_kwargs
    except AttributeError:
        return repr(client)
    if options.get("path"):
        return f"unix://{options['path']}"
    return f"{options.get('host', '?')}:{options.get('port', '?')}/{options.get('db', 0)}"


# The registry client's timeouts when the middleware makes it (a URL, or the RedisBroker's
# connection settings): redis-py before 8 has none, and a partition then holds the pump
# thread, the reports and a guarded actor's start check for as long as TCP retries (minutes).
REGISTRY_TIMEOUTS = {"socket_connect_timeout": 5.0, "socket_timeout": 5.0}


def _with_timeouts(client: redis.Redis) -> redis.Redis:
    """`client` (the RedisBroker's), or, where its connections have no timeouts, a client of
    the same connection settings with `REGISTRY_TIMEOUTS` (the broker's own is left as the
    user made it). A pool of another kind (Sentinel's) is used as it is."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    missing = {k: v for k, v in REGISTRY_TIMEOUTS.items() if kwargs.get(k) is None}
    if not missing or type(pool) is not redis.ConnectionPool:
        return client
    return redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **{**kwargs, **missing}
        )
    )


class RecurringMiddleware(Middleware):
    """Sync the broker's recurring schedules at worker boot and run the pump in the worker.

    `repeat` is the registry: a `Repeat`, or a Redis client or `redis://` URL to open one
    under `prefix`. By default it is the broker's own Redis client when the broker is a
    `RedisBroker`, else `$REDIS_URL`.
    `source` tags what this app's sync owns: a reboot removes the schedules this source
    declared before and no longer declares, and never touches others; two apps sharing a
    registry need distinct sources. `schedule_file` adds a config file's schedules (synced
    under the file's own source). `generation` is the declarations' generation, an int each
    deploy raises: a worker of an older generation syncs nothing (one WARNING), so workers of
    two versions booting in turn never flip a schedule back and forth. With `run_pump`, each
    worker process runs one pump thread on `pump_queues` (default: every queue the broker
    declares). It sends through `dramatiq_dispatcher(broker, pipelined)`: by default
    (`pipelined=None`) a claimed batch in one round trip on a `RedisBroker`
    (`PipelinedDramatiqDispatcher`, same messages and hooks as `broker.enqueue`), one
    `broker.enqueue` per message on any other broker; `pipelined=False` always enqueues one by
    one, `True` requires the fast path (a `RedisBroker` only). `listeners`
    (`emq_bridge.events.PumpEvents`) hear what each worker process's pump does:
    `listeners=[emq_bridge.metrics.MetricsEvents()]` counts it.

    With `report` (the default) each worker process reports what becomes of the occurrences
    it runs (started, succeeded, retrying, failed, skipped: `outcomes.MessageOutcomes`) to
    the registry, which keeps the last `history_size` of each registration
    (`Repeat.history`) and applies the overlap and failure policies from them. A running
    occurrence is heartbeated every `heartbeat_s`; one not heard of for `3 * heartbeat_s`
    (its worker was killed) is marked lost by the next pump scan. Reports are sent by a
    background thread: they never slow or fail an actor, and while Redis is down they are
    dropped (one WARNING); `flush_reports()` waits until those queued so far were sent (a
    test reading `Repeat.history` right after `worker.join()`).

    A boot that cannot reach Redis, or finds an invalid schedule or an unknown actor,
    raises `BootError` and the worker does not start.
    """

    def __init__(
        self,
        repeat: Repeat | str | Any = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        source: str = DEFAULT_SOURCE,
        schedule_file: str | os.PathLike[str] | None = None,
        run_pump: bool = True,
        sync_at_boot: bool = True,
        prune: bool = True,
        pump_queues: Iterable[str] | None = None,
        lease_ms: int = 60_000,
        max_sleep_s: float = 5.0,
        pipelined: bool | None = None,
        generation: int | None = None,
        report: bool = True,
        history_size: int = HISTORY_SIZE,
        heartbeat_s: float = HEARTBEAT_S,
        listeners: Iterable[PumpEvents] = (),
    ) -> None:
        self.prefix = validate_prefix(prefix)
        try:
            self.history_size = check_history_size(history_size)
        except ValueError as exc:
            raise ConfigError(f"RecurringMiddleware(history_size=...): {exc}") from None
        if isinstance(heartbeat_s, bool) or not (
            isinstance(heartbeat_s, (int, float)) and 0 < heartbeat_s < float("inf")
        ):
            raise ConfigError(
                f"RecurringMiddleware(heartbeat_s=...) must be a positive number of seconds, "
                f"got {heartbeat_s!r}"
            )
        self.heartbeat_s = float(heartbeat_s)
        for flag, value in (
            ("report", report),
            ("run_pump", run_pump),
            ("sync_at_boot", sync_at_boot),
            ("prune", prune),
        ):
            if not isinstance(value, bool):
                raise ConfigError(
                    f"RecurringMiddleware({flag}=...) must be True or False, got {value!r}"
                )
        self.report = report
        self.source = validate_name(source, "source")
        try:
            generation_arg(generation, self.source)
        except ConfigError as exc:
            raise ConfigError(f"RecurringMiddleware(generation=...): {exc}") from exc
        self.generation = generation
        if schedule_file is not None and not isinstance(schedule_file, str | os.PathLike):
            raise ConfigError(
                f"RecurringMiddleware(schedule_file=...) must be a path, got {schedule_file!r}"
            )
        self.schedule_file = os.fspath(schedule_file) if schedule_file is not None else None
        self.run_pump = run_pump
        self.sync_at_boot = sync_at_boot
        self.prune = prune
        if isinstance(pump_queues, str | bytes) or not (
            pump_queues is None or isinstance(pump_queues, Iterable)
        ):  # a string is an Iterable[str] too: each letter a queue
            raise ConfigError(
                "RecurringMiddleware(pump_queues=...) must be a list of queue names, "
                f"got {pump_queues!r}"
            )
        self.pump_queues = tuple(validate_name(q, "queue") for q in pump_queues or ())
        check_pump_options(
            lease_ms=lease_ms, max_sleep_s=max_sleep_s, owner="RecurringMiddleware(...): "
        )
        if pipelined is not None and not isinstance(pipelined, bool):
            raise ConfigError(
                "RecurringMiddleware(pipelined=...) must be True, False or None (automatic), "
                f"got {pipelined!r}"
            )
        self.pipelined = pipelined
        self.lease_ms = lease_ms
        self.max_sleep_s = max_sleep_s
        if not isinstance(listeners, Iterable):
            raise ConfigError(
                "RecurringMiddleware(listeners=...) must be a list of PumpEvents, "
                f"got {listeners!r}"
            )
        self.listeners = tuple(listeners)
        self._registry_spec = repeat
        self.repeat: Repeat | None = repeat if isinstance(repeat, Repeat) else None
        self.plans: list[SyncPlan] = []
        # When this worker's declarations were synced (server ms), set at boot.
        self.synced_ms: int | None = None
        self.declarations: tuple[Declaration, ...] = ()
        self.pump: Pump | None = None
        self._reports_stuck = False  # the shutdown's flush timed out: the close waits less
        # Syncs the declarations again should the registry lose them (`start_pump`).
        self.watch: RegistryWatch | None = None
        self._pump_thread: threading.Thread | None = None
        self._pump_stop = threading.Event()
        self._broker: dramatiq.Broker | None = None
        # The pump thread's dispatcher, built at boot so that a broker it cannot send to
        # stops the worker (`before_worker_boot`), not only its pump (`after_worker_boot`).
        self._dispatcher: Any = None
        self.outcomes = MessageOutcomes(self._new_reporter, self._registry_prefix)

    @property
    def actor_options(self) -> set[str]:
        return {RECURRING_OPTION}

    # -- Dramatiq hooks ------------------------------------------------------------------

    def before_declare_actor(
        self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]
    ) -> None:
        if RECURRING_OPTION in actor.options:
            try:
                actor_declarations(actor)
            except (ScheduleError, TypeError, ValueError) as exc:
                raise RecurringOptionError(f"actor {actor.actor_name!r}: {exc}") from exc

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        set_current_message(message)
        if self.report:
            self._broker = self._broker or broker
            # A guarded occurrence the broker delivers while another one runs (a killed
            # worker's message requeued after it was marked lost, a retry that waited past
            # its hold) is skipped: the overlap policy holds at the start, not only the send.
            verdict = self.outcomes.started(message)
            if verdict == "skip":
                raise SkipMessage("another occurrence of its schedule is in flight (overlap)")
            if verdict == "copy":
                _keep_first_result(message)
                log.info(
                    "emq-bridge: message %s dropped: this attempt of its occurrence ran already "
                    "(delivered twice, or sent again by hand, from a dead-letter queue or by a "
                    "middleware that postponed it: a guarded occurrence runs once; "
                    "`emq-bridge trigger QUEUE NAME` runs the schedule now)",
                    message.message_id,
                )
                raise SkipMessage("a copy of this occurrence ran already (delivered twice)")
            if verdict == "running":
                # A copy delivered while its first copy runs elsewhere, heartbeated: not run
                # beside it, but delivered again once those heartbeats would have lapsed (a
                # worker killed mid-run, its message handed on at once: it runs then).
                # Unbounded: this worker cannot tell a copy that comes back while a long run
                # goes on from one whose run died since (Celery's can: `MAX_RESENDS`).
                try:
                    broker.enqueue(message, delay=self.outcomes.lapse_ms + REDELIVER_MARGIN_MS)
                except Exception as exc:  # dropped then, as a Celery worker drops it
                    log.warning("emq-bridge: a copy of %s was dropped: %s", message, exc)
                _keep_first_result(message)  # after the enqueue: the copy sent on keeps its own
                raise SkipMessage("a copy of this occurrence runs elsewhere (delivered twice)")

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        set_current_message(None)
        if self.report:
            self.outcomes.processed(message, exception)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        set_current_message(None)
        if self.report:
            self.outcomes.skipped(message)

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        if self.report:  # `Retries` sending the message in hand again: a retry
            self.outcomes.enqueued(message, delay)

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        if self.report:
            self.outcomes.acked(message)

    def after_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        if self.report:
            # A message for an actor this worker does not declare (a new actor's, met by an
            # old worker in a rolling deploy): Dramatiq dead-letters it unrun.
            try:
                broker.get_actor(message.actor_name)
                actor_found = True
            except ActorNotFound:
                actor_found = False
            except Exception:  # never into the worker: reported as any nacked message
                actor_found = True
            self.outcomes.nacked(message, actor_found)

    def before_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        # Dramatiq logs and drops any exception here that is not a MiddlewareError: every
        # failure becomes a BootError, so the worker stops instead of running unscheduled.
        self._broker = broker
        try:
            self.boot(broker)
            if self.run_pump:
                # Dramatiq logs and drops what `after_worker_boot` raises: the worker would
                # run with no pump (`pipelined=True` on a broker that is not a RedisBroker).
                self._dispatcher = dramatiq_dispatcher(broker, self.pipelined)
        except Exception as exc:
            log.critical("emq-bridge: recurring schedules could not be set up: %s", exc)
            raise BootError(f"recurring schedules could not be set up at boot: {exc}") from exc

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        if self.report:
            self.outcomes.watch_waiting(worker)
        if self.run_pump:
            self.start_pump(broker)

    def before_consumer_thread_shutdown(self, broker: dramatiq.Broker, thread: Any) -> None:
        # The worker stops: its consumers fetch no more, and what it holds unstarted goes
        # back to the broker (`MessageOutcomes.hand_back`).
        if self.report:
            self.outcomes.hand_back()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        outage = self.pump is not None and self.pump.in_outage
        self.stop_pump()
        flushed = self.outcomes.flush(REPORT_FLUSH_STUCK_S if outage else REPORT_FLUSH_S)
        self._reports_stuck = not flushed

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        # The actors that ended while the worker stopped reported after the flush above.
        self.outcomes.close(REPORT_FLUSH_STUCK_S if self._reports_stuck else REPORT_FLUSH_S)

    def flush_reports(self, timeout_s: float = 5.0) -> bool:
        """Wait until the outcome reports this worker process queued so far (started,
        succeeded, retrying, failed, skipped) were sent to the registry, at most `timeout_s`;
        True once they were (or none waited), False if some still wait.

        Reports leave from a background thread: a test that reads `Repeat.history` (or a
        registration's counters) right after `stub_broker.join(queue)` and `worker.join()`
        calls this first, as what the worker threads reported may not have reached the
        registry yet. `worker.stop()` flushes them too.
        """
        return self.outcomes.flush(timeout_s)

    def _registry_prefix(self) -> str:
        """The prefix of the registry, without building it: the given `Repeat`'s, else
        `prefix` (what `registry` builds it with)."""
        return self.repeat.prefix if self.repeat is not None else self.prefix

    def _new_reporter(self) -> Reporter:
        """This process's reporter: it opens the registry in its own thread, on first send."""
        return Reporter(
            lambda: self.registry(self._broker),
            history_size=self.history_size,
            heartbeat_s=self.heartbeat_s,
        )

    # -- boot ------------------------------------------------------------------------------

    def registry(self, broker: dramatiq.Broker | None) -> Repeat:
        """Return the registry: the one given, else the RedisBroker's client, else `$REDIS_URL`."""
        if self.repeat is None:
            spec = self._registry_spec
            if spec is None and isinstance(broker, RedisBroker):
                self.repeat = Repeat(_with_timeouts(broker.client), self.prefix)
                return self.repeat
            if spec is None:
                spec = os.environ.get("REDIS_URL")
            if spec is None:
                raise ConfigError(
                    f"RecurringMiddleware on a {type(broker).__name__} needs a registry: pass "
                    "repeat= (a Repeat, a Redis client or a redis:// URL) or set REDIS_URL"
                )
            if isinstance(spec, str):  # its errors hold no password; the URL's options win
                self.repeat = Repeat.from_url(spec, self.prefix, **REGISTRY_TIMEOUTS)
            else:
                self.repeat = Repeat(spec, self.prefix)
        return self.repeat

    @without_gc
    def boot(self, broker: dramatiq.Broker) -> list[SyncPlan]:
        """Check the registry answers, then sync the declared schedules; return the applied plans.

        Raises `RegistryUnavailable` when Redis cannot be reached, `ScheduleError` or
        `ConfigError` for an invalid schedule or an unknown actor.
        """
        repeat = self.registry(broker)
        try:
            repeat.server_time_ms()
        except RegistryUnavailable as exc:
            raise RegistryUnavailable(f"{exc} at {_address(repeat.client)}") from exc
        plans = self.sync_declared(broker, repeat, apply=self.sync_at_boot)
        # What this worker's declarations are as of now: a record its source rewrites later
        # is newer code's (a rolling deploy), which this worker's pump must not park.
        self.synced_ms = repeat.server_time_ms()
        return plans

    def sync_declared(
        self, broker: dramatiq.Broker, repeat: Repeat, *, apply: bool = True
    ) -> list[SyncPlan]:
        """Validate what the broker's actors and the schedule file declare and, with `apply`,
        sync it into `repeat` as a worker's boot does (this middleware's source, generation,
        prune and file); return the applied plans. `emq-bridge pump --dramatiq` syncs
        through this too, whatever `sync_at_boot` says (it is the deploy step's sync)."""
        code = broker_declarations(broker)
        # Stamped syncs (docs/design.md, sync and ownership): a worker process whose
        # declarations and file are those of the last sync, with nothing else written since,
        # reads no record, and does not read its schedule file again.
        stamps = apply and self.prune
        sources: list[tuple[str, tuple[Declaration, ...], Stamp | bool | None]] = [
            (self.source, code, stamps)
        ]
        unread: SyncPlan | None = None  # the file's, when its stamp holds
        if self.schedule_file is not None:
            # With report=False the file's definitions are read for the warning below.
            found = self._file_stamp(repeat, broker) if stamps and self.report else None
            if found is not None and found.holds:
                log.info(
                    "emq-bridge: %s unchanged since its last sync (%d schedule(s)): the file "
                    "is not read again",
                    found.source,
                    found.declared,
                )
                unread = SyncPlan(found.source, by_stamp=True, vouched=found.declared)
            else:
                loaded = load_schedule_file(self.schedule_file)
                check_actors(broker, loaded.declarations, self.schedule_file)
                its_stamp = found.stamp_for(loaded) if found is not None else None
                sources.append((loaded.source, loaded.declarations, its_stamp))
        check_one_source((source, declared) for source, declared, _ in sources)
        self.declarations = tuple(d for _, declared, _ in sources for d in declared)
        if not self.report:
            guarded = sorted(
                f"{d.queue}/{d.name}"
                for d in self.declarations
                if d.definition.overlap != "allow" or d.definition.pause_after_failures
            )
            if guarded:
                log.warning(
                    "RecurringMiddleware(report=False): %s declare an overlap or failure policy, "
                    "which needs the workers' reports; without them a guarded occurrence stays "
                    "in flight until the pump's start timeout",
                    ", ".join(guarded),
                )
        self.plans = []
        if apply:
            # `sync` logs its plan: changes at WARNING/INFO, unchanged schedules at DEBUG only,
            # so the processes of a deploy do not log every schedule they find unchanged.
            # Each source prunes the schedules of this broker's actors only: a worker pool
            # that imports some actor modules cannot tell another pool's were dropped, and
            # two apps' schedule files may share a source (`file:schedules.toml`, a default).
            actors = frozenset(broker.actors)
            for source, declared, stamp in sources:
                plan = sync(
                    repeat,
                    declared,
                    source,
                    prune=self.prune,
                    generation=self.generation,
                    stamp=stamp,
                    prune_tasks=actors,
                    empty_prunes=source == self.source,  # a file's: refused emptied
                    # The file's names, when its stamp held: its code may not take them.
                    unread_sources=(unread.source,) if unread is not None else (),
                )
                self.plans.append(plan)
            if unread is not None:
                self.plans.append(unread)
        return self.plans

    def _file_stamp(self, repeat: Repeat, broker: dramatiq.Broker) -> FileStamp | None:
        """The schedule file's stamp, checked against the broker's actors and their queues
        (what `check_actors` checks the file against); None when the registry cannot say."""
        assert self.schedule_file is not None
        actors = ";".join(f"{name} {a.queue_name}" for name, a in sorted(broker.actors.items()))
        try:
            return file_stamp(repeat, self.schedule_file, self.generation, actors)
        except EmqError as exc:  # the full path reports the file's errors, then the registry's
            log.debug("emq-bridge: the schedule file's stamp could not be read: %s", exc)
            return None

    def queues(
        self, broker: dramatiq.Broker, declarations: Iterable[Declaration] = ()
    ) -> tuple[str, ...]:
        """Return the pump's queues: `pump_queues`, else the broker's and the declared ones."""
        if self.pump_queues:
            return self.pump_queues
        declared = {d.queue for d in declarations}
        # A queue Dramatiq takes but the registry's names cannot (over 200 bytes): no
        # schedule can be on it, so it is not pumped (else the pump could not start at all).
        declared |= {q for q in broker.get_declared_queues() if _registry_name(q)}
        return tuple(sorted(declared))

    # -- the pump thread -----------------------------------------------------------------

    def start_pump(self, broker: dramatiq.Broker) -> Pump:
        """Start a pump thread on this worker's queues (a no-op if one runs); return the pump."""
        if self.pump is not None and self._pump_thread is not None and self._pump_thread.is_alive():
            return self.pump
        dispatcher, self._dispatcher = self._dispatcher, None
        pump = Pump(
            self.registry(broker),
            self.queues(broker, self.declarations),
            dispatcher or dramatiq_dispatcher(broker, self.pipelined),
            lease_ms=self.lease_ms,
            max_sleep_s=self.max_sleep_s,
            history_size=self.history_size,
            listeners=self.listeners,
            code=(self.source, self.generation),
            code_synced_ms=self.synced_ms,
        )
        pump.heartbeat.role = "dramatiq-worker"
        if self.sync_at_boot:
            # A registry restarted empty (no persistence) is synced again, as at the boot.
            self.watch = RegistryWatch(
                pump.repeat,
                pump.queues,
                [plan.source for plan in self.plans],
                lambda: self._sync_again(broker),
            )
            pump.add_listener(self.watch)
        self._pump_stop = threading.Event()
        self._pump_thread = threading.Thread(
            target=self._run_pump, args=(pump, self._pump_stop), name="emq-bridge-pump", daemon=True
        )
        self.pump = pump
        self._pump_thread.start()
        if self.watch is not None:
            self.watch.start()
        log.info(
            "emq-bridge pump started in the worker on queues %s (%s)",
            ", ".join(pump.queues),
            "pipelined"
            if isinstance(pump.dispatcher, PipelinedDramatiqDispatcher)
            else "one broker.enqueue per message",
        )
        return pump

    def stop_pump(self, timeout_s: float = PUMP_JOIN_S) -> None:
        """Stop the pump thread once it has settled the batch in hand (`Pump.stop`: what it
        has not sent within half a second is handed back to the next pump, same ids)."""
        self._pump_stop.set()
        if self.watch is not None:
            self.watch.stop()
        thread, self._pump_thread = self._pump_thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():  # a send that hangs: its leases expire as after a crash
                log.warning(
                    "emq-bridge pump thread did not stop within %.0fs; what it holds is re-sent "
                    "when its leases expire",
                    timeout_s,
                )

    def _sync_again(self, broker: dramatiq.Broker) -> list[SyncPlan]:
        """The boot's sync again (`sync_declared`: same source, generation, stamps and
        pruning), run by the registry watch when the registry lost the declared schedules."""
        repeat = self.registry(broker)
        plans = self.sync_declared(broker, repeat)
        self.synced_ms = repeat.server_time_ms()
        if self.pump is not None:  # its own records, rewritten now: not newer code's
            self.pump.code_synced_ms = self.synced_ms
        return plans

    @staticmethod
    def _run_pump(pump: Pump, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                pump.run(stop)
            except Exception:
                # Pump.run retries Redis outages itself; anything else is a bug or a broken
                # registry: log it with its traceback and pump again after a pause.
                log.exception("emq-bridge pump failed; it restarts in %.0fs", PUMP_RESTART_S)
                stop.wait(PUMP_RESTART_S)


def _registry_name(queue: str) -> bool:
    """Whether `queue` is a name the registry takes (`keys.validate_name`); one that is not
    is said at INFO, each time a pump starts."""
    try:
        validate_name(queue, "queue")
    except ScheduleError as exc:
        log.info("emq-bridge: queue %r is not pumped: %s", queue[:60], exc)
        return False
    return True


def _keep_first_result(message: Any) -> None:
    """Keep Dramatiq's `Results` from storing this dropped copy's skip (`None`) under the
    occurrence's id, over what its first copy's run stored: `Results` reads
    `store_results` from the message's options before the actor's."""
    options = getattr(message, "options", None)
    if isinstance(options, dict):
        options["store_results"] = False
