"""`SentAcker`: acks what a batch already sent while one of its sends blocks.

Part of the pump. A batch sent one occurrence at a time is acked at its end; its leases are
extended between sends once half the lease has passed. A send that blocks past the lease
(a broker that holds its publishers: RabbitMQ's memory alarm, a stalled connection) would
let the leases of the occurrences sent before it expire too, and another pump would send
those again. While the batch is sent, a thread of its own acks what the broker already
accepted once a quarter of the lease has passed since the leases were last written (well
before they expire: the sent part is done, so early is harmless): then only the
occurrence whose send blocks may go out twice (guarantees.md). It extends nothing: a send
that never returns must not hold its leases, nor those of the occurrences after it, forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from .occurrence import Occurrence
from .registry import Repeat

__all__ = ["SentAcker"]

log = logging.getLogger("emq_bridge.pump")


class SentAcker:
    """Ack the accepted occurrences of `batch` (their outcome None in `outcomes`, which the
    sending thread appends to) once the leases are a quarter of their age: a send is slow.

    The sending thread holds `lock` while it extends the leases, and then calls `renewed`
    with the new deadline: the acks are fenced by the deadline the leases hold, and `fired`
    is counted by the ack that drops a lease (the pump's own ack at the batch's end drops
    none of these twice). `stop` ends the thread; the caller then acks as ever.
    """

    def __init__(
        self,
        repeat: Repeat,
        queue: str,
        batch: Sequence[Occurrence],
        outcomes: Sequence[BaseException | None],
        *,
        deadline_ms: int,
        written_at: float,
        lease_ms: int,
        released_ms: int,
    ) -> None:
        self.lock = threading.Lock()
        self._repeat, self._queue = repeat, queue
        self._batch, self._outcomes = batch, outcomes
        self._deadline_ms, self._written_at = deadline_ms, written_at
        self._after_s = lease_ms / 4000
        self._released_ms = released_ms
        self._acked = 0  # the outcomes up to here were looked at
        self._done = threading.Event()
        # Checked sixteen times a lease: an ack comes well before the leases expire.
        self._every_s = max(0.01, lease_ms / 16000)
        self._thread = threading.Thread(target=self._run, name="emq-sent-acker", daemon=True)
        self._thread.start()

    def renewed(self, deadline_ms: int, written_at: float) -> None:
        """The sending thread extended the leases (holding `lock`): their new deadline."""
        self._deadline_ms, self._written_at = deadline_ms, written_at

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self._every_s):
            with self.lock:
                if time.monotonic() - self._written_at < self._after_s:
                    continue
                sent = len(self._outcomes)
                accepted = [
                    self._batch[i].lease_member
                    for i in range(self._acked, sent)
                    if self._outcomes[i] is None
                ]
                self._acked = sent
                if not accepted:
                    continue
                try:
                    self._repeat.ack(
                        self._queue,
                        accepted,
                        deadline_ms=self._deadline_ms,
                        released_ms=self._released_ms,
                    )
                except Exception as exc:  # the batch's own ack at its end tries again
                    log.debug(
                        "%s: acking the sent part of a slow batch failed: %s", self._queue, exc
                    )
                    return
