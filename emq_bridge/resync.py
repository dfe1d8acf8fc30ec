"""Syncing a process's declarations again when the registry lost them (Redis restarted empty).

A beat or a Dramatiq worker syncs what it declares once, at boot. A registry Redis restarted
without persistence (or flushed) comes back empty: the pumps ride the outage out, then find
nothing to send, and nothing would fire until the processes restart, though each still holds
its declarations in memory. `RegistryWatch` is the pump listener that notices and syncs them
again, as the boot did (same sources, generation, stamps and pruning).

It checks when the pump's outage ends (`on_outage_end`), and every `check_s` (a minute) for
a restart the pump did not see as an outage, if the pump ticked since the last check: one
round trip, an `EXISTS` per watched item, on a thread of its own, never the pump's. The
watched items are those present once the process synced: each queue it pumps (its
registry sorted set or its `synced` hash: a cancel of every schedule keeps the second, a
stamped sync writes it in every queue it reads) and each source's stamp record
(`keys.synced_key`: a second app whose schedules share a queue another app's re-sync filled
again still sees its own gone). When one is gone, the watch waits a moment (up to
`spread_s`, so that the processes that noticed together do not all sync in full: the first
one's stamp then holds for the others) and runs the boot sync: a stamped sync reads next to
nothing when nothing was lost, and a full one puts back what was. Re-syncs racing in several
processes are safe: each write is an idempotent upsert that re-checks the generation, and
exactly one process gets `created` for a schedule, so only the processes that put some back
log it (one WARNING each).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence

from .errors import EmqError, RegistryRedirected, RegistryUnavailable
from .events import PumpEvents, Tick
from .keys import synced_key
from .registry import Repeat
from .sync import SyncPlan

__all__ = ["CHECK_S", "SPREAD_S", "RegistryWatch"]

log = logging.getLogger(__name__)

# How often a watch checks its registry while the pump sees no outage (seconds; each check
# waits a random 0.75 to 1.25 of it, so that the processes of a deploy do not check at once).
CHECK_S = 60.0
# A watch that found its keys gone waits a random time up to this before it syncs again.
SPREAD_S = 2.0

Sync = Callable[[], Sequence[SyncPlan]]
"""Run the process's boot sync again; return the plans it applied."""


class RegistryWatch(PumpEvents):
    """Sync a process's declarations again (`sync`) when its registry lost them.

    `queues` are the queues its pump serves, `sources` the sources its boot synced. Hand it to
    the pump as a listener, then `start()` it once the boot sync is done; `stop()` it with
    the pump. A failed check or sync (Redis gone again, a schedule file broken on disk since
    the boot) is logged (once per distinct error) and tried again at the next check.
    """

    def __init__(
        self,
        repeat: Repeat,
        queues: Sequence[str],
        sources: Sequence[str],
        sync: Sync,
        *,
        check_s: float = CHECK_S,
        spread_s: float = SPREAD_S,
    ) -> None:
        self.repeat = repeat
        self.sync = sync
        self.check_s = check_s
        self.spread_s = spread_s
        keys = [repeat.keys(q) for q in dict.fromkeys(queues)]
        # Each item is the keys of one `EXISTS`: one slot each (a queue's share its hash tag).
        self._items: dict[str, tuple[str, ...]] = {
            **{f"queue {k.queue}": (k.registry, k.synced) for k in keys},
            **{f"source {s}": (synced_key(repeat.prefix, s),) for s in dict.fromkeys(sources)},
        }
        self._watched: set[str] = set()
        self._due = threading.Event()
        self._stopped = threading.Event()
        self._outage = False
        # Whether the pump ticked since the last periodic check: a pump no longer run (its
        # process abandoned it without `stop`) has its registry checked no more.
        self._ticked = False
        self._failed: str | None = None
        self._thread: threading.Thread | None = None

    # -- pump events (the pump's thread: quick) --------------------------------------------

    def on_tick(self, tick: Tick) -> None:
        self._ticked = True

    def on_outage_begin(self, error: BaseException) -> None:
        self._outage = True

    def on_outage_end(self, seconds: float) -> None:
        self._outage = False
        self._ticked = True
        self._due.set()  # Redis is back, maybe empty: check now

    # -- the watch -------------------------------------------------------------------------

    def arm(self) -> None:
        """Note which watched items the registry holds now (one round trip): those are
        watched. Never raises (a registry that cannot say is read again at the next check)."""
        try:
            self._watched = self.present()
        except EmqError as exc:
            log.debug("emq-bridge: the registry watch could not read the registry: %s", exc)

    def start(self) -> None:
        """`arm`, then check on a daemon thread of its own (a no-op if started)."""
        if self._thread is not None:
            return
        self.arm()
        self._thread = threading.Thread(target=self._run, name="emq-bridge-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (a sync in progress goes on, on its daemon thread)."""
        self._stopped.set()
        self._due.set()

    def present(self) -> set[str]:
        """Return the watched items the registry holds (one round trip: a pipeline of one
        `EXISTS` per item). Raises `RegistryUnavailable`/`RegistryError`."""
        items = list(self._items.items())
        found = self.repeat.any_exist([keys for _, keys in items], "watch the registry")
        return {item for (item, _), exists in zip(items, found, strict=True) if exists}

    def check(self) -> int | None:
        """Check the registry now; sync again if a watched item is gone. Return how many
        schedules the sync put back (None: nothing was gone, no sync)."""
        present = self.present()
        gone = sorted(self._watched - present)
        if not gone:
            self._watched = present  # what appeared since is watched from now on
            return None
        # Spread the processes that noticed together: the first one's sync (and stamp)
        # makes the others' cheap.
        if self._stopped.wait(random.uniform(0, self.spread_s)):
            return None
        plans = self.sync()
        self._watched = self.present()  # what the sync left: an item still gone is not watched
        self._tell(gone, plans)
        return sum(_put_back(plan) for plan in plans)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._due.wait(self.check_s * random.uniform(0.75, 1.25))
            self._due.clear()
            if self._stopped.is_set():
                return
            if self._outage or not self._ticked:  # the outage's end (a tick) makes the check
                continue
            self._ticked = False
            try:
                self.check()
            except Exception as exc:  # never out of the thread: tried again at the next check
                self._report(exc)
            else:
                self._failed = None

    def _report(self, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if message == self._failed:
            return
        self._failed = message
        # Redis gone again is the pump's outage, which the pump logs itself.
        level = logging.DEBUG if isinstance(exc, RegistryUnavailable) else logging.WARNING
        # A cluster that kept redirecting (a reshard, a failover) is told in its line alone:
        # redis-py's traceback of its redirections says nothing more.
        traced = level == logging.WARNING and not isinstance(exc, RegistryRedirected)
        log.log(
            level,
            "emq-bridge: the registry watch failed; it tries again at its next check: %s",
            message,
            exc_info=traced,
        )

    @staticmethod
    def _tell(gone: Sequence[str], plans: Sequence[SyncPlan]) -> None:
        lost = {plan.source: _put_back(plan) for plan in plans if _put_back(plan)}
        if lost:
            log.warning(
                "emq-bridge: the registry lost %d schedule(s) of %s (Redis restarted empty, or "
                "evicted them: its maxmemory-policy must be noeviction): "
                "synced again",
                sum(lost.values()),
                ", ".join(lost)
                if len(lost) == 1
                else ", ".join(f"{s} ({n})" for s, n in lost.items()),
            )
            return
        refused = [p for p in plans if p.refused_by is not None]
        log.info(
            "emq-bridge: %s gone from the registry; synced again: every schedule of %s was "
            "there (none was lost, or another process put them back first)%s",
            ", ".join(gone),
            ", ".join(dict.fromkeys(plan.source for plan in plans)) or "this process",
            f" (a newer generation, {refused[0].refused_by}, is live)" if refused else "",
        )


def _put_back(plan: SyncPlan) -> int:
    """How many schedules `plan` put back: created, or restored (a record without its member)."""
    return len(plan.create) + len(plan.restored)
