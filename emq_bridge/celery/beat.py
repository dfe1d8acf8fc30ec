"""`RepeatScheduler`: `celery beat` on the Repeat registry (`celery beat -S emq`)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from celery import Celery, signals
from celery.beat import Scheduler, SchedulingError

from ..bulk import gc_paused
from ..errors import ConfigError, EmqError
from ..events import PumpEvents
from ..occurrence import Occurrence
from ..pump import STOP_DEADLINE_S, Pump
from ..resync import RegistryWatch
from ..sync import SyncPlan
from .declare import (
    AppSchedule,
    boot_schedule,
    boot_sources,
    flag_setting,
    registry_prefix,
    repeat_for,
    shown_registry_url,
)
from .dispatch import CeleryDispatcher
from .pipelined import PipelinedCeleryDispatcher
from .reporting import history_size_setting
from .sentry import BeatMonitors, beat_monitors, monitoring

__all__ = ["BeatRefused", "RepeatScheduler"]

log = logging.getLogger("emq_bridge.celery")

# How long a beat that stops waits for the registry to remove its heartbeat (a registry that
# hangs must not hold the stop; the heartbeat then expires on its own).
CLOSE_REGISTRY_S = 1.0

_PIPELINED_OFF = (
    "emq_bridge_pipelined is off: Sentry Crons monitors beat tasks, and each task carries "
    "its own check-in"
)


class BeatLog(PumpEvents):
    """The beat's log line per task sent, in the words of Celery's own beat (`Scheduler:
    Sending due task <entry> (<task>)`, which log alerts grep for), then its id and queue.
    It is written once the broker took the task."""

    def on_dispatch(self, occurrence: Occurrence) -> None:
        log.info(
            "Scheduler: Sending due task %s (%s) id %s queue %s",
            occurrence.name,
            occurrence.template.get("task"),
            occurrence.id,
            occurrence.queue,
        )


class BeatRefused(SystemExit):
    """The beat cannot start: its schedules are invalid or its registry unreachable.

    A `SystemExit` (code 1), so `celery beat` ends on the one error line logged, not on
    that line and Celery's traceback of it. `error` is the emq-bridge error.
    """

    def __init__(self, error: EmqError) -> None:
        super().__init__(1)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


# The scheduler this thread is building, if any. Celery's stop handler (`Service.sync`, a
# SIGTERM or SIGINT handler installed before the service builds its scheduler) reads
# `Service.scheduler`, a cached property not yet set while the first is being built, so a
# stop during the boot would build a second scheduler inside the handler: a second boot
# sync, a second pump and watch, while the first one is suspended.
_building = threading.local()


class RepeatScheduler(Scheduler):  # type: ignore[misc]
    """`celery beat` on the Repeat registry: any number of beats, each occurrence sent once.

    At start it validates and syncs the app's schedules (refusing to run if that fails),
    then every tick claims what is due through the registry. State lives in Redis, so a
    restart neither resets countdowns nor fires extra runs. `lazy=True` touches nothing.
    """

    #: Seconds between registry checks at most, so runtime changes are picked up quickly.
    max_interval = 5
    #: celery-redbeat's `beat_init` receiver, connected whenever `redbeat.schedulers` is
    #: imported (sentry-sdk's Celery integration imports it), takes its beat lock unless the
    #: scheduler has no `lock_key`: this one has none, and needs no lock.
    lock_key = None

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        self.pump: Pump | None = None
        self.plan: AppSchedule | None = None
        self.watch: RegistryWatch | None = None
        self._monitors: BeatMonitors | None = None
        # Set when a stop did not end `STOP_DEADLINE_S` after its signal because the tick
        # waits on the registry (`_overdue`): `close` then leaves the registry alone.
        self.registry_silent = False
        self._where = ""  # the registry's URL, redacted: what a stop that hangs names
        self._closed = False
        # Set once Celery's beat service runs this scheduler (`beat_init`): from then on a
        # tick sleeps itself, waking at a registry change (see `tick`).
        self.in_service = False
        # The scheduler this one stands in for: set when built while another is being built
        # in this thread, i.e. by Celery's stop handler during the boot (`_building`).
        self._stands_for: RepeatScheduler | None = getattr(_building, "scheduler", None)
        if self._stands_for is not None:
            kwargs["lazy"] = True  # it syncs nothing: its `close` stops the one being built
            super().__init__(app, *args, **kwargs)
            return
        _building.scheduler = self
        try:
            super().__init__(app, *args, **kwargs)
        finally:
            _building.scheduler = None
        signals.beat_init.connect(self._on_beat_init, weak=True)

    def _on_beat_init(self, sender: Any = None, **_: Any) -> None:
        # `Service.scheduler` is a cached property: the service that runs this scheduler
        # holds it in its `__dict__` (touching it would build a scheduler of its own).
        if getattr(sender, "__dict__", {}).get("scheduler") is self:
            self.in_service = True

    def setup_schedule(self) -> None:
        """Validate and sync the app's schedules, then build the pump; raise if either fails.

        The beat owns the app's schedules: its sync (`sync_app`) writes `beat_schedule` and the
        `@recurring` tasks and removes what the app no longer declares. A sync refused because
        a newer `emq_bridge_generation` is live writes nothing and is logged; the beat pumps.
        A restart of unchanged declarations whose stamp holds converts and syncs nothing
        (`boot_schedule`).
        """
        repeat = None
        try:
            # The history its skipped and lost entries are trimmed to: the workers' setting.
            history_size = history_size_setting(self.app)
            # Its dispatcher too, before anything is written: the fast path refuses a broker
            # it cannot send on (ConfigError), as the sync refuses a bad entry.
            dispatcher = self._dispatcher()
            repeat = repeat_for(self.app)
            plan = boot_schedule(self.app, repeat)
        except Exception as exc:
            if repeat is not None:
                repeat.close()
            error = (
                exc
                if isinstance(exc, EmqError)
                else ConfigError(f"emq-bridge beat could not sync its schedules: {exc}")
            )
            log.error("emq-bridge beat refuses to start: %s", error)
            raise BeatRefused(error) from exc
        self.plan = plan
        self.pump = Pump(
            repeat,
            plan.queues,
            dispatcher,
            resolve_cadence=plan.resolve_cadence,
            max_sleep_s=float(self.max_interval),
            history_size=history_size,
            listeners=[BeatLog()],
        )
        self.pump.heartbeat.role = "celery-beat"
        self.pump.check_eviction_policy()
        self._where = shown_registry_url(self.app)
        # A registry restarted empty (no persistence) is synced again, as at this boot.
        self.watch = RegistryWatch(
            repeat, plan.queues, boot_sources(self.app, plan), self._sync_again
        )
        self.pump.add_listener(self.watch)
        self.watch.start()
        log.info(
            "emq-bridge beat: %d schedule(s) declared; pumping %s in %s (prefix %r)",
            plan.count,
            ", ".join(plan.queues),
            self._where,
            repeat.prefix,
        )

    def _sync_again(self) -> tuple[SyncPlan, ...]:
        """The boot's sync again (`boot_schedule`: same stamps, generation and pruning), run
        by the registry watch when the registry lost the app's schedules."""
        assert self.pump is not None
        return boot_schedule(self.app, self.pump.repeat).synced

    def _overdue(self) -> str:
        """Return what a tick that did not end `STOP_DEADLINE_S` after a stop waits on: the
        broker (a send), else the registry, which `close` then leaves alone."""
        if self.pump is not None and self.pump.sending:
            return "a broker that hangs?"
        self.registry_silent = True
        return f"the registry Redis at {self._where} does not answer?"

    def _dispatcher(self) -> CeleryDispatcher | PipelinedCeleryDispatcher:
        """The app's dispatcher: the fast path with `emq_bridge_pipelined` (unless Sentry
        Crons monitors the beat's tasks: each carries its own check-in)."""
        pipelined = flag_setting(self.app, "emq_bridge_pipelined", False)
        self._monitors = beat_monitors(self.app)  # Sentry Crons, when sentry-sdk is installed
        if pipelined and self._monitors is not None and monitoring():
            log.warning(_PIPELINED_OFF)
            pipelined = False
        if pipelined:
            return PipelinedCeleryDispatcher(self.app)
        return self._monitored_dispatcher()

    def _monitored_dispatcher(self) -> CeleryDispatcher:
        monitors = self._monitors
        return CeleryDispatcher(
            self.app, extra_headers=monitors.headers if monitors is not None else None
        )

    def _pipelined_unless_monitored(self) -> None:
        """Give up the fast path once Sentry Crons monitors the beat's tasks. Checked at
        each tick while pipelined, not only at the scheduler's build: Celery builds it before
        it sends `beat_init`, where the docs' setup (and Sentry's) calls `sentry_sdk.init`."""
        assert self.pump is not None
        if self._monitors is None or not monitoring():
            return
        log.warning(_PIPELINED_OFF)
        pipelined = self.pump.dispatcher
        self.pump.dispatcher = self._monitored_dispatcher()
        if isinstance(pipelined, PipelinedCeleryDispatcher):
            pipelined.close()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send everything due now through the registry; return the seconds to sleep.

        Outages and broken queues are handled (logged once, retried) by `Pump.step`, so
        beat's service loop never exits on them. A SIGTERM or SIGINT during the tick is held
        until the batch in hand is settled (`Pump.stop`), then given to Celery's handler,
        which exits: nothing claimed waits out its lease, and nothing is sent twice. A second
        one is given at once (the pump then hands back what it has not sent).

        Run by Celery's beat service (`celery beat`, `worker -B`), the tick then sleeps
        itself, as the service would, but wakes as soon as a registry change is published
        (a schedule added, edited, resumed or triggered at runtime, a buffered slot
        released), and returns 0: runtime changes are sent when due, not at the next of the
        beat's `max_interval` wake-ups. Celery's signal handlers run during that sleep as
        during the service's own.
        """
        if self.pump is None:
            raise SchedulingError("emq-bridge beat has no synced registry; it refuses to run")
        if self._closed:
            # Closed by Celery's stop handler, whose SystemExit was lost on its way out of
            # the sleep (`Pump.sleep` re-raises it; this is the guard): a closed beat sends
            # nothing more, and ends the service loop as that handler meant to.
            raise SystemExit()
        stop = threading.Event()
        if isinstance(self.pump.dispatcher, PipelinedCeleryDispatcher):
            self._pipelined_unless_monitored()
        if self.in_service:
            self.pump.listen()  # before the step: a change published during it ends the sleep
        # The cyclic collector is held off while a tick drains (as the boot's conversion is,
        # bulk.py): what a drain allocates stays alive (decoded templates, message parts) or
        # is freed by reference counting, so the collector's passes over a beat's heap found
        # next to nothing, and cost about a tenth of a 10,000-occurrence drain.
        with _signals_held(stop, self._overdue), gc_paused():
            _, delay = self.pump.step(stop)
        delay = float(min(self.max_interval, delay))
        if not self.in_service or delay <= 0:
            return delay
        self.pump.sleep(delay)
        return 0.0

    def sync(self) -> None:
        """Nothing to save: every move was written to Redis when it happened."""

    def close(self) -> None:
        """Stop the pump (a tick in progress settles its batch), then release the broker
        connection (Celery's part) and the registry's connection.

        Within about `CLOSE_REGISTRY_S` whatever the registry does: the heartbeat is removed
        only if the registry answers that soon, and not tried at all while it is out (the
        pump's outage) or when the stop is overdue because a tick waits on it (a registry
        that does not answer); the heartbeat then expires. Celery calls it twice (its signal
        handler, then the service's exit): the second does nothing more.
        """
        if self._stands_for is not None:
            self._stands_for.close()
            return
        signals.beat_init.disconnect(self._on_beat_init)
        pump = self.pump
        if pump is not None:
            pump.stop()
        if self.watch is not None:
            self.watch.stop()
        super().close()
        if pump is None or self._closed:
            return
        self._closed = True
        if isinstance(pump.dispatcher, PipelinedCeleryDispatcher):
            pump.dispatcher.close()
        if self.registry_silent or pump.in_outage:
            log.info("emq-bridge beat: the registry is not answering; its heartbeat expires")
        else:
            _bounded(
                lambda: _leave(pump),  # a beat that stops is not alive
                CLOSE_REGISTRY_S,
                "emq-bridge beat: the registry did not answer within %.1fs of the stop; the "
                "beat's heartbeat expires",
            )
        pump.unlisten()
        pump.repeat.close()  # also ends a removal left running (its connection closes)

    @property
    def info(self) -> str:
        """Return the banner line naming the registry (touches nothing)."""
        try:
            where = shown_registry_url(self.app)
        except EmqError as exc:  # the banner must not fail; setup_schedule reports it
            where = f"not configured ({exc})"
        return f"    . registry -> {where} (emq-bridge, prefix {registry_prefix(self.app)!r})"


def _leave(pump: Pump) -> None:
    """Remove the pump's heartbeat and close its wake-up subscription (never raises)."""
    try:
        pump.unlisten()
        pump.heartbeat.remove(pump.repeat)
    except Exception as exc:  # a connection closed under it by the stop: it expires
        log.debug("the beat's heartbeat could not be removed: %s", exc)


def _bounded(call: Callable[[], None], timeout_s: float, late: str) -> None:
    """Run `call` on a daemon thread and wait for it `timeout_s` at most (logging `late`,
    with the timeout, if it is not done then): a call that hangs is left behind."""
    thread = threading.Thread(target=call, name="emq-bridge-close", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning(late, timeout_s)


_HELD = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def _signals_held(
    stop: threading.Event, overdue: Callable[[], str] = lambda: "a broker that hangs?"
) -> Iterator[None]:
    """Hold SIGTERM and SIGINT while a tick runs: the first sets `stop`, and is handed on once
    the tick is done to the handler it displaced (Celery's, which raises `SystemExit`; the
    default action in `worker -B`'s beat process); a second is handed on at once, and so is
    the first if the tick has not ended `STOP_DEADLINE_S` after it (a send blocked on a
    broker that hangs, or a registry call on a Redis that does not answer, never sees
    `stop`: the `SystemExit` interrupts it, and the pump hands back the batch in hand); the
    warning says what the tick waits on, as `overdue()` tells it. Should the stop still not
    have ended `STOP_DEADLINE_S` later (the hand-back waits on the same registry), a
    `SystemExit` is raised where it waits, and the alarm is left set to end the process (its
    default action) after one more `STOP_DEADLINE_S`: the stop ends within about three of
    them whatever hangs. Off the main thread, or for an ignored signal, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in _HELD}
    held: list[tuple[int, FrameType | None]] = []
    causes: list[str] = []  # what the first overdue found the tick waiting on
    ending: list[bool] = []  # set by a second overdue: the last alarm is left to end it

    def hand_on(signum: int, frame: FrameType | None) -> None:
        handler = previous[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)
        else:  # the default action: as if never held
            signal.signal(signum, handler)
            signal.raise_signal(signum)

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:
            hand_on(signum, frame)
            return
        held.append((signum, frame))
        log.info(
            "%s received: settling the batch in hand, then stopping", signal.Signals(signum).name
        )
        stop.set()
        signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_S)

    def alarm(signum: int, frame: FrameType | None) -> None:
        if causes:  # the hand-on hangs too (the hand-back on a silent registry)
            log.error(
                "the stop did not end within %.1fs more (%s): the beat exits now; what it "
                "claimed and did not settle is sent again when its leases expire",
                STOP_DEADLINE_S,
                causes[0],
            )
            ending.append(True)
            # The last resort: should the exit hang too, the alarm's default action ends it.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_S)
            raise SystemExit()
        cause = overdue()
        causes.append(cause)
        if cause.startswith("a broker"):
            log.warning(
                "the tick did not end within %.1fs of the stop (%s): its send is interrupted; "
                "the rest of the batch is handed back to the next pump",
                STOP_DEADLINE_S,
                cause,
            )
        else:
            log.warning(
                "the tick did not end within %.1fs of the stop (%s): it is interrupted; what "
                "it claimed and did not settle is sent again when its leases expire",
                STOP_DEADLINE_S,
                cause,
            )
        signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_S)  # should the hand-back hang too
        hand_on(*held[0])

    installed = [s for s, h in previous.items() if callable(h) or h == signal.SIG_DFL]
    for sig in installed:
        signal.signal(sig, hold)
    previous_alarm = signal.getsignal(signal.SIGALRM)
    if installed:
        signal.signal(signal.SIGALRM, alarm)
    try:
        yield
    finally:
        if installed and not ending:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_alarm or signal.SIG_DFL)
        for sig in installed:
            signal.signal(sig, previous[sig])
    if held:
        hand_on(*held[0])
