"""`Reporter`: sends what a worker process tells of its occurrences, off the task's path.

The adapters' signal handlers and middleware hooks call `Reporter.report` (and
`Reporter.finish` for the end of a run whose start they reported), which only queue the
report: a task never waits for Redis and never fails because of it. One background thread
per process sends what is queued, one `report.lua` call per queue per batch
(`Repeat.report`), and heartbeats the occurrences this process is running, so an occurrence
whose worker is killed is marked lost once its heartbeats stop.

A `started` report waits aside until its run has lasted `linger_s`: a run that ends before
then reports its start in its final report (`started_ms`), one update for a short task, and
its start never goes to the queue; a longer run's start is sent on its own.

If Redis cannot be reached (`RegistryUnavailable`), the reports wait: the batch goes back to
the front of the queue, in order, and the thread tries again, backing off from 0.5 s to 5 s,
once Redis answers a probe; a report is idempotent by occurrence id and attempt, so a batch
whose reply was lost may be sent twice. So the final report of an occurrence run unguarded
during an outage (its overlap check failed) still ends its in-flight marker, and its
`skip` schedule goes on once Redis is back. At most `max_pending` reports wait, past it the
newest are dropped; a flush or a close (a worker stopping) drops what a failing send leaves.
One WARNING when reports begin to wait, one when some are dropped, one INFO with the counts
when they go through again. A queue whose call fails otherwise (a key of the wrong type, a
cluster slot that kept redirecting) drops only its own reports of the batch. A forked child
(Celery's prefork pool) gets a thread of its own on its first report; what the parent had
queued stays the parent's.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable

from .errors import RegistryUnavailable, ReportBatchError
from .lifecycle import BeginVerdict, check_history_size
from .outcome import BEAT_KINDS, FINAL_STATUSES, HISTORY_SIZE, Report, ReportKind
from .registry import Repeat

__all__ = ["HEARTBEAT_S", "Reporter"]

log = logging.getLogger("emq_bridge.reporting")

# A running occurrence is heartbeated this often; it is lost after three missed heartbeats.
HEARTBEAT_S = 10.0
# Reports per `Repeat.report` call: one script call stays short on the server.
BATCH = 500
# Reports queued at most; past it new reports are dropped (Redis too slow or gone).
MAX_PENDING = 100_000
# While Redis is unreachable the reports wait, tried again after this long, doubled each
# time up to the most: an outage of seconds costs a second, a long one a call every 5 s.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
# How long the thread lets reports gather before it sends them: a batch, not a call per
# task, is what keeps the reports' cost a small part of a short task's.
LINGER_S = 0.05


class Reporter:
    """Queue reports and send them from a background thread (see the module docstring).

    `repeat` is a `Repeat` or a callable returning one (called in the sending thread the
    first time, so a forked child connects on its own). `history_size` is the number of
    occurrences each registration's history keeps; `heartbeat_s` how often running
    occurrences are heartbeated (they are lost after `3 * heartbeat_s` without one);
    `linger_s` how long reports gather before they are sent (at most `BATCH` a call), and
    how long a run lasts before its `started` report is sent on its own: a start still
    waiting when its occurrence's final report comes is folded into it, so a short task
    costs the registry one update.
    """

    def __init__(
        self,
        repeat: Repeat | Callable[[], Repeat],
        *,
        history_size: int = HISTORY_SIZE,
        heartbeat_s: float = HEARTBEAT_S,
        max_pending: int = MAX_PENDING,
        linger_s: float = LINGER_S,
    ) -> None:
        if heartbeat_s <= 0:
            raise ValueError("heartbeat_s must be positive")
        if not 0 <= linger_s < heartbeat_s:
            raise ValueError("linger_s must be from 0 to less than heartbeat_s")
        self.linger_s = linger_s
        self._repeat_source = repeat
        self.history_size = check_history_size(history_size)
        self.heartbeat_s = heartbeat_s
        self.max_pending = max_pending
        self._reset()
        _LIVE.add(self)

    @property
    def _failing(self) -> bool:
        """Redis is not taking reports since a send failed: they wait or are dropped (the
        overlap checks that may wait on Redis do not ask meanwhile)."""
        return self._waiting or self._dropping

    @property
    def heartbeat_ttl_ms(self) -> int:
        return int(self.heartbeat_s * 3000)

    def _reset(self) -> None:
        """Fresh state for this process (at construction, and in a forked child, right after
        the fork: `_after_fork`)."""
        self._lock = threading.Condition()
        # Set to wake the thread (the first report of a batch, a full batch, a flush, a
        # close): `report` appends without the lock, so a task pays no lock per report.
        self._wake = threading.Event()
        self._idle = False  # the thread waits for a first report (only then is `_wake` set)
        self._pending: deque[Report] = deque()
        self._running: dict[tuple[str, str], Report] = {}
        # The `started` reports not sent yet, by occurrence, with when they were queued
        # (`time.monotonic()`): the run's final report takes its start from here, or the
        # thread sends it once the run lasted `linger_s`. A `pop` by either side claims it,
        # so it is sent exactly once (atomic under the GIL).
        self._unsent: dict[tuple[str, str], tuple[Report, float]] = {}
        # Registration (queue, name) -> the occurrence whose start waits aside (at most one:
        # a report of another occurrence of it sends that start first, `_claim_start`).
        self._open: dict[tuple[str, str], tuple[str, str]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sending = 0
        self._flushing = 0
        # Redis is not taking reports (`_failing`): `_waiting` while the thread keeps what it
        # could not send and backs off `_retry_s`, `_dropping` once a drop was logged;
        # `_dropped` counts the reports dropped. All reset when a send goes through.
        self._waiting = False
        self._dropping = False
        self._dropped = 0
        self._retry_s = RETRY_FIRST_S
        self._repeat: Repeat | None = None
        # The reports kept after a failed send, by id (the reference keeps the id theirs):
        # the outcome listeners (metrics) heard of them then, not again when they are sent.
        self._told: dict[int, Report] = {}
        # Runs another process runs that this one heartbeats too (`watch`); not a forked
        # child's: it watches nothing of its parent's.
        self._watched: Callable[[], Iterable[Report]] | None = None
        # What stops the watched runs a `replace` took over (`watch`).
        self._on_replaced: Callable[[list[Report]], None] | None = None
        # The worker stops (`hand_back`): the copies it holds unstarted go back to its
        # broker, so they are heartbeated (`waiting`) no more.
        self._handed_back = False
        # The `waiting` reports heartbeated within the heartbeat TTL, by occurrence and
        # attempt, with when (`time.monotonic()`): each may be in flight by these heartbeats
        # alone, and a Celery worker no longer lists them once its connection closed and
        # gave them back to the broker (`hand_back`).
        self._beaten_waiting: dict[tuple[str, str, int], tuple[Report, float]] = {}
        # What `hand_back` left for the thread to queue (it may run in a signal handler).
        self._handing_back: list[Report] = []

    def report(self, item: Report) -> None:
        """Queue `item`; never blocks on Redis and never raises."""
        if self._closed:
            return
        # Single dict and deque operations are atomic under the GIL: no lock on this path.
        key = (item.queue, item.id)
        kind = item.kind
        if kind in BEAT_KINDS:
            self._append(item)
            return
        if not item.task_ran:
            # A copy that never ran (`Report.task_ran`) ends nothing of this process: a run
            # of the same occurrence here goes on, heartbeated. Its start, if still waiting
            # aside, is sent first (not folded), so the registry sees the run, then the copy.
            waiting = self._unsent.pop(key, None)
            if waiting is not None:
                self._append(waiting[0])
            self._append(item, after_claims=waiting is None)
            return
        if kind != "started":
            self._running.pop(key, None)
            start, claimed = self._claim_start(key, item.name)
            if start is not None:
                if (
                    start.attempt == item.attempt
                    and item.started_ms is None
                    and kind in FINAL_STATUSES
                ):
                    item = item.folded(start)
                else:  # another attempt's start, a retry's, a final with its own: sent first
                    self._append(start)
            self._append(item, after_claims=claimed)
            return
        self._running[key] = item
        waiting = self._unsent.get(key)
        if waiting is not None and waiting[0].attempt == item.attempt:
            if waiting[0].at_ms >= item.at_ms:
                return  # the same start again, or an earlier one: the later start holds
        else:  # a start of another attempt, or of another occurrence of it, goes first
            previous, _ = self._claim_start(key, item.name)
            if previous is not None:
                self._append(previous)
        self._unsent[key] = (item, time.monotonic())
        self._open[(item.queue, item.name)] = key
        if self._thread is None:
            self._ensure_thread()
        if self._idle:  # the thread sleeps until a heartbeat: it sends this start
            self._idle = False
            self._wake.set()

    def finish(
        self, start: Report, kind: ReportKind, at_ms: int, error: str = "", *, hold_ms: int = 0
    ) -> None:
        """Queue the `kind` report that ends the run `start` began (`Report.ended`), carrying
        the start when it was not sent yet: what `report(start.ended(...))` queues, built
        once. Never blocks on Redis and never raises."""
        if self._closed:
            return
        key = (start.queue, start.id)
        self._running.pop(key, None)
        waiting, claimed = self._claim_start(key, start.name)
        started_ms = None
        if waiting is not None:
            if waiting.attempt == start.attempt and kind in FINAL_STATUSES:
                started_ms = waiting.at_ms
            else:  # another attempt's start, or a retry's (it ends no run): sent first
                self._append(waiting)
        self._append(
            start.ended(kind, at_ms, error, hold_ms=hold_ms, started_ms=started_ms),
            after_claims=claimed,
        )

    def _claim_start(self, key: tuple[str, str], name: str) -> tuple[Report | None, bool]:
        """Take the start of occurrence `key` (of registration `name`) waiting aside, if any,
        for its final report to carry; and send on its own any start of another occurrence
        of that registration still waiting, ahead of the report being queued. So a start is
        folded only into a final that follows it with no report of its registration in
        between, and the registry ends as if each report had been sent alone, in order.

        Returns the start (or None) and whether a start this report follows may have been
        claimed by the thread instead (not found here): the report is then queued under the
        lock, behind it (`_append(after_claims=True)`)."""
        other = self._open.pop((key[0], name), None)
        claimed = False
        if other is not None and other != key:
            waiting = self._unsent.pop(other, None)
            if waiting is not None:
                self._append(waiting[0])
            else:
                claimed = True
        mine = self._unsent.pop(key, None)
        if mine is None:
            return None, True
        return mine[0], claimed

    def _append(self, item: Report, *, after_claims: bool = False) -> None:
        """Queue `item`. With `after_claims`, under the lock the thread holds while it moves
        the starts it claims into the queue: a start it took from under this report (the
        run ended as its start fell due) is then queued first, not after it."""
        if after_claims:
            with self._lock:
                self._append_now(item)
        else:
            self._append_now(item)

    def _append_now(self, item: Report) -> None:
        pending = self._pending
        if len(pending) >= self.max_pending:
            with self._lock:
                self._drop(1, "the report queue is full")
            return
        pending.append(item)
        if self._thread is None:
            self._ensure_thread()
        # Wake the thread only when it waits for a first report, or when a batch fills up
        # (once per BATCH reports, not on every report while it is behind): an Event.set per
        # report would cost more than the rest of `report`. A wake missed by two threads
        # appending at once costs at most the linger.
        if self._idle or len(pending) % BATCH == 0:
            self._idle = False
            self._wake.set()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="emq-bridge-reporter", daemon=True
                    )
                    self._thread.start()

    def watch(
        self,
        runs: Callable[[], Iterable[Report]],
        *,
        replaced: Callable[[list[Report]], None] | None = None,
    ) -> None:
        """Heartbeat, besides the runs this process reports, the ones `runs()` lists at each
        heartbeat (their `started` or `heartbeat` reports): runs another process runs that
        this one sees. A Celery prefork worker's main process so heartbeats its pool
        processes' runs: a task that holds the GIL (a long C call, such as a big `sum` or a
        regular expression that backtracks) starves its own process's heartbeat thread, and
        would be marked lost while it runs. A heartbeat changes only an occurrence still in
        flight, so one of a run that just ended changes nothing. `runs` is called from the
        reporter's thread, and its heartbeats sent in a call of their own, dropped (at
        DEBUG) when they fail. `replaced` is called, from that thread, with the heartbeats
        of runs a `replace` took over whose revoke did not stop them (`Repeat.beat`): the
        caller stops them. Starts the thread, which a forked child does not inherit (it
        watches nothing)."""
        self._watched = runs
        self._on_replaced = replaced
        # A worker started again in this process (a test's `Worker` per test) holds what
        # it holds afresh: heartbeated, not handed back.
        self._handed_back = False
        self._beaten_waiting = {}
        self._ensure_thread()

    def _beat_watched(self) -> None:
        """Heartbeat the runs `watch` names, in a call of their own: they are another
        process's, whose own reporter keeps and tells its reports when Redis is down; a beat
        of them that fails is dropped (the next comes in `heartbeat_s`), said at DEBUG."""
        watched = self._watched
        if watched is None or self._failing:
            return
        try:
            runs = list(watched())
            if self._handed_back:
                runs = [r for r in runs if r.kind != "waiting"]
            else:
                self._note_waiting([r for r in runs if r.kind == "waiting"])
            beats = [_heartbeat(r) for r in runs]
            replaced = (
                self.registry().beat(
                    beats, history_size=self.history_size, heartbeat_ttl_ms=self.heartbeat_ttl_ms
                )
                if beats
                else []
            )
        except Exception as exc:  # never stop the thread: the runs heartbeat themselves too
            log.debug("the runs this process watches were not heartbeated: %s", exc)
            return
        stop = self._on_replaced
        if replaced and stop is not None:
            try:
                stop(replaced)
            except Exception as exc:  # never stop the thread
                log.warning("runs a `replace` took over were not stopped: %s", exc)

    def hand_back(self, hold_ms: int, *, wake: bool = True) -> None:
        """The worker stops, and its broker gets back the messages it holds unstarted: have
        the thread queue, for each `waiting` report `watch` lists now or listed within the
        heartbeat TTL, one that keeps its occurrence in flight `hold_ms` from now (the start
        timeout: it waits in the broker as a fresh send does, for a worker that may come only
        once this one is replaced), unless its run began or ended meanwhile; and heartbeat
        such copies no more (each would cut that back to the heartbeat TTL). A `close` sends
        them. Takes no lock, so a signal handler may call it (Celery's
        `worker_shutting_down`) with `wake=False`: the thread then queues them at its next
        pass, within `heartbeat_s`, well inside what their last heartbeat gave them. Never
        raises."""
        self._handed_back = True
        watched = self._watched
        if watched is None or self._closed:
            return
        try:
            held = [r for r in watched() if r.kind == "waiting"]
        except Exception:  # never into the worker's stop: those heartbeated lately still go
            held = []
        self._note_waiting(held)
        # A copy waiting for its eta (a retry's backoff) keeps the longer hold it had.
        self._handing_back = [
            run.ended("waiting", run.at_ms, hold_ms=max(hold_ms, run.hold_ms))
            for run, _ in list(self._beaten_waiting.values())
        ]
        if wake:
            self._wake.set()

    def _note_waiting(self, runs: list[Report]) -> None:
        """Remember `runs` (`waiting` reports) as heartbeated now, and forget those not
        heartbeated for the heartbeat TTL (lost by then, or started)."""
        now = time.monotonic()
        beaten = self._beaten_waiting
        for run in runs:
            beaten[(run.queue, run.id, run.attempt)] = (run, now)
        expired = now - self.heartbeat_ttl_ms / 1000
        for key, (_, at) in list(beaten.items()):
            if at < expired:
                beaten.pop(key, None)  # the other thread (a consumer's, the reporter's) may too

    def ended(self, item: Report) -> None:
        """The run of `item`'s occurrence ended (its actor returned): heartbeat it no more,
        though its final report may not come (a broker ack that failed: it is then lost once
        its last heartbeat expires, rather than kept in flight as long as this process
        lives)."""
        self._running.pop((item.queue, item.id), None)

    def begin(self, item: Report, *, mark: bool = True) -> BeginVerdict:
        """Ask, before a worker runs the occurrence `item` starts, whether it may
        (`Repeat.begin_verdict`, one round trip from the calling thread): `"skip"` while
        another occurrence of its guarded registration is in flight, `"copy"` when this
        attempt ran elsewhere, `"running"` when it runs elsewhere now, `"run"` when it may and
        when Redis cannot answer. With
        `mark=False` it only asks (writes nothing), and not at all while reports cannot be
        sent (Redis down: the calling thread, a worker's consumer, must not wait on it)."""
        if not mark and self._failing:
            return "run"
        try:
            repeat = self.registry()
        except Exception as exc:  # never into the task: run it, the claim's guard holds
            log.warning("an occurrence was run unguarded: its overlap check failed: %s", exc)
            return "run"
        return repeat.begin_verdict(item, heartbeat_ttl_ms=self.heartbeat_ttl_ms, mark=mark)

    def mark_running(self, start: Report) -> None:
        """Make `start`'s occurrence of a guarded registration the one in flight now, from
        the calling thread (`begin` with its mark; one round trip), so it is lost within the
        heartbeats' bound even if this process dies before its start report leaves. Whatever
        the answer, the run goes on (the adapter checked before); while reports cannot be
        sent (Redis down) nothing is asked. Never raises."""
        if self._failing:
            return
        self.begin(start)

    def known_prefix(self) -> str | None:
        """The prefix of this reporter's registry when it is known without building it (it
        was given as a `Repeat`, or is built already); else None."""
        built = self._repeat if self._repeat is not None else self._repeat_source
        return built.prefix if isinstance(built, Repeat) else None

    def registry(self) -> Repeat:
        """This process's `Repeat`, built on first use (in whichever thread needs it)."""
        if self._repeat is None:
            with self._lock:
                if self._repeat is None:
                    source = self._repeat_source
                    self._repeat = source if isinstance(source, Repeat) else source()
        return self._repeat

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every report queued so far was sent or dropped; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._flushing += 1  # no lingering while someone waits
            self._wake.set()
            try:
                while self._pending or self._sending or self._unsent or self._handing_back:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._thread is None:
                        return False
                    self._lock.wait(min(left, 0.05))
            finally:
                self._flushing -= 1
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (waiting at most `timeout_s`), then stop the thread."""
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
        self._wake.set()

    # -- the sending thread ----------------------------------------------------------------

    def _run(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        pending, wake, unsent = self._pending, self._wake, self._unsent
        while True:
            # `_idle` before the check: a report appended after it sees it and wakes us.
            self._idle = True
            if not pending and not self._closed:
                wait = next_beat - time.monotonic()
                if unsent:  # until the oldest start waiting aside is due
                    wait = min(wait, self._starts_due_in())
                wake.wait(max(0.0, wait))
            self._idle = False
            wake.clear()
            if self._handing_back:
                handed, self._handing_back = self._handing_back, []
                pending.extend(handed)
            if self._closed and not pending and not unsent:
                return
            # Let a batch gather (a full one, a flush or a close sends at once).
            gather_until = time.monotonic() + self.linger_s
            while (
                0 < len(pending) < BATCH
                and not (self._closed or self._flushing)
                and (left := gather_until - time.monotonic()) > 0
            ):
                wake.wait(left)
                wake.clear()
            # While reports wait for Redis, the heartbeats of one round at most wait with them;
            # the next round is queued once those went (at once: it is due by then).
            if time.monotonic() >= next_beat and not (self._waiting and pending):
                next_beat = time.monotonic() + self.heartbeat_s
                pending.extend(_heartbeat(r) for r in list(self._running.values()))
                self._beat_watched()
            with self._lock:
                # The starts of runs that lasted `linger_s` (all of them on a flush or a
                # close) join the queue behind what is in it: every report of their
                # registration queued before came before them, and any queued after the
                # claim comes after. Under the lock, so that `flush` never sees a start
                # neither waiting nor queued.
                pending.extend(self._due_starts(everything=self._closed or bool(self._flushing)))
                batch = [pending.popleft() for _ in range(min(BATCH, len(pending)))]
                self._sending = len(batch)
            kept = False
            try:
                if batch:
                    kept = self._send(batch)
            finally:
                with self._lock:
                    self._sending = 0
                    self._lock.notify_all()
            if kept:
                self._back_off()

    def _stopping(self) -> bool:
        """A flush or a close waits: a send that fails drops its reports, none waits."""
        return self._closed or bool(self._flushing)

    def _back_off(self) -> None:
        """Wait `_retry_s` before the kept reports are tried again. A report queued meanwhile
        does not cut it short (it waits behind them); a flush or a close does."""
        until = time.monotonic() + self._retry_s
        wake = self._wake
        while not self._stopping() and (left := until - time.monotonic()) > 0:
            wake.wait(left)
            wake.clear()

    def _starts_due_in(self) -> float:
        """Seconds until the oldest start waiting aside has waited `linger_s` (0 if due)."""
        oldest = min((queued for _, queued in list(self._unsent.values())), default=None)
        if oldest is None:
            return self.linger_s
        return max(0.0, oldest + self.linger_s - time.monotonic())

    def _due_starts(self, *, everything: bool) -> list[Report]:
        """Claim the starts that waited aside `linger_s` (with `everything`, all of them), in
        the order they came."""
        unsent = self._unsent
        if not unsent:
            return []
        cutoff = time.monotonic() - self.linger_s
        claimed = []
        for key, (_, queued) in list(unsent.items()):
            if everything or queued <= cutoff:
                waiting = unsent.pop(key, None)  # None: its final report took it meanwhile
                if waiting is not None:
                    claimed.append(waiting[0])
        return claimed

    def _send(self, batch: list[Report]) -> bool:
        """Send `batch`; True when Redis was unreachable and it was kept (`_keep`): the
        thread then backs off. Reports that failed otherwise are dropped."""
        if self._waiting and not self._stopping() and not self._redis_answers():
            with self._lock:
                self._keep(batch, "Redis does not answer")
            return True
        told = self._told
        try:
            self.registry().report(
                batch,
                history_size=self.history_size,
                heartbeat_ttl_ms=self.heartbeat_ttl_ms,
                told=[item for item in batch if id(item) not in told] if told else None,
            )
        except Exception as exc:  # never into the tasks
            return self._not_sent(batch, exc)
        if told:
            for item in batch:
                told.pop(id(item), None)
        if self._failing:
            with self._lock:
                self._recovered(len(batch))
        return False

    def _redis_answers(self) -> bool:
        """Whether Redis answers again (one TIME round trip), asked before kept reports are
        sent again: a round trip, not a batch of up to `BATCH` reports, each while it is
        down."""
        try:
            self.registry().server_time_ms()
        except RegistryUnavailable:
            return False
        except Exception:  # refused otherwise (an ACL without TIME): the batch will tell
            return True
        return True

    def _not_sent(self, batch: list[Report], exc: Exception) -> bool:
        """Keep (outage) or drop the reports of `batch` that `exc` says were not applied;
        True when kept. A batch error names the queues whose call failed: the other
        queues' reports went through."""
        unsent = batch
        if isinstance(exc, ReportBatchError) and exc.queues:
            failed = set(exc.queues)
            unsent = [item for item in batch if item.queue in failed]
        reason = f"{type(exc).__name__}: {exc}"
        told = self._told
        with self._lock:
            for item in batch:  # applied, or dropped below: not kept as told
                told.pop(id(item), None)
            if isinstance(exc, RegistryUnavailable) and not self._stopping():
                # The listeners heard of them at this call: not again when they are sent.
                told.update((id(item), item) for item in unsent)
                self._keep(unsent, reason)
                return True
            self._drop(len(unsent), reason)
        return False

    def _keep(self, reports: list[Report], reason: str) -> None:
        """Put `reports` back at the front of the queue, in order, to be sent again once
        Redis answers; back off longer each time (lock held). At most `max_pending` wait:
        past it the newest queued behind them are dropped, as a full queue drops new ones."""
        pending = self._pending
        over = len(pending) + len(reports) - self.max_pending
        dropped = 0
        told = self._told
        while over > dropped and pending:
            # The newest report queued (a task may append meanwhile: atomic).
            told.pop(id(pending.pop()), None)
            dropped += 1
        if over > dropped:
            for item in reports[len(reports) - (over - dropped) :]:
                told.pop(id(item), None)
            del reports[len(reports) - (over - dropped) :]
            dropped = over
        pending.extendleft(reversed(reports))
        if self._waiting:
            self._retry_s = min(2 * self._retry_s, RETRY_MAX_S)
        else:
            self._waiting, self._retry_s = True, RETRY_FIRST_S
            log.warning(
                "occurrence reports wait until Redis takes them again (%s); %d queued; "
                "the tasks are not affected",
                reason,
                len(pending),
            )
        if dropped:
            self._drop(dropped, "the report queue is full")

    def _recovered(self, sent: int) -> None:
        """A send went through after reports failed: say what waited and what was dropped
        (lock held), and end the failure."""
        if self._waiting:
            log.info(
                "occurrence reports reach Redis again; %d kept meanwhile are sent, %d were dropped",
                sent + len(self._pending),
                self._dropped,
            )
        else:
            log.info(
                "occurrence reports reach Redis again; %d were dropped meanwhile", self._dropped
            )
        self._waiting = self._dropping = False
        self._dropped, self._retry_s = 0, RETRY_FIRST_S

    def _drop(self, count: int, reason: str) -> None:
        """Count `count` dropped reports; the first drop of a failure is logged (lock held)."""
        self._dropped += count
        if not self._dropping:
            self._dropping = True
            log.warning(
                "occurrence reports are dropped until Redis takes them again (%s); "
                "the tasks are not affected",
                reason,
            )


def _heartbeat(run: Report) -> Report:
    """The heartbeat of the run `run` (its `started` or `heartbeat` report) reports; a
    `waiting` report (a copy held unstarted) as it is."""
    if run.kind == "waiting":
        return run
    return Report(
        "heartbeat",
        run.queue,
        run.name,
        run.id,
        run.due_ms,
        run.at_ms,
        run.attempt,
        triggered=run.triggered,
        backfill=run.backfill,  # out of band: never a run a `replace` took over (`Repeat.beat`)
    )


# Every Reporter of this process, so that a forked child (Celery's prefork pool) resets them at
# the fork: its thread and locks were the parent's. A hook at the fork, not a `getpid()` on
# every report (a system call per report, in every task).
_LIVE: weakref.WeakSet[Reporter] = weakref.WeakSet()


def _after_fork() -> None:
    for reporter in list(_LIVE):
        reporter._reset()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork)

# How long a process that ends waits, in all, for its reporters to send what they hold.
EXIT_FLUSH_S = 2.0


@atexit.register
def _flush_at_exit() -> None:
    """Send what the process's reporters still hold as the interpreter exits (their thread is
    a daemon: it would die with them queued), within `EXIT_FLUSH_S` in all. A process that
    leaves through `os._exit` (a `multiprocessing` pool's child) or is killed runs no exit
    hook: what it did not flush is lost."""
    deadline = time.monotonic() + EXIT_FLUSH_S
    for reporter in list(_LIVE):
        left = deadline - time.monotonic()
        # Its lock is held while its thread builds the registry (a connect that hangs, with
        # no timeout): not waited for past the deadline.
        if left <= 0 or not reporter._lock.acquire(timeout=left):
            return
        try:
            reporter.flush(max(0.0, deadline - time.monotonic()))
        except Exception:  # never in the way of the exit
            return
        finally:
            reporter._lock.release()
