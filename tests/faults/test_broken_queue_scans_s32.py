"""A queue whose cluster slot keeps redirecting (a reshard holding it MIGRATING) costs the
pump's other queues nothing, and is told once, at WARNING.

Found by a probe: `step` put every queue in each tick's pipeline of scans
(`Repeat.scan_many`), the broken ones too, and redis-py retried the redirections of a slot
held MIGRATING until "TTL exhausted" at every tick: 3-13 ms for 20 queues became 150-242 ms,
every tick, for all the queues. The queue was told at ERROR as "a registry move failed",
though a reshard is no broken registry, and the registry watch logged redis-py's 40-line
traceback of its redirections. Now a broken queue is left out of the pipeline and retried on
its own, after the others, at most once per `BROKEN_RETRY_S`, and rejoins the pipeline once
it succeeds; a cluster that kept redirecting (`RegistryRedirected`) is told at WARNING, once
per spell, and the watch tells it in its one line.

The slot is held MIGRATING with the queue's `running` key absent: a script naming a key the
source holds and one it does not is answered TRYAGAIN, which redis-py retries until its
redirections run out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from itertools import pairwise

import pytest
import redis
from redis.crc import key_slot

from emq_bridge import Pump, Repeat
from emq_bridge.errors import RegistryError, RegistryUnavailable
from emq_bridge.events import Tick
from emq_bridge.pump import BROKEN_RETRY_S
from emq_bridge.registry import Scan
from emq_bridge.resync import RegistryWatch
from emq_bridge.testing import RecordingDispatcher

from .cluster import Cluster, wait_for
from .test_cluster_migrating_slot_s26 import migrating

pytestmark = pytest.mark.faults

MOVING = "moving"
HEALTHY = [f"h{i}" for i in range(8)]
HELD_S = 3.5  # how long the test holds the slot MIGRATING under a running pump


class CountedScans(Repeat):
    """A registry that notes each tick's pipeline of scans and each scan of one queue."""

    def __init__(self, client: redis.cluster.RedisCluster, prefix: str) -> None:
        super().__init__(client, prefix)
        self.batches: list[tuple[str, ...]] = []  # the queues of each `scan_many`
        self.alone: list[tuple[str, float]] = []  # each `scan`: its queue, when (monotonic)

    def scan_many(
        self, queues: Sequence[str], batch: int, now_ms: int | None = None
    ) -> list[Scan | RegistryError]:
        self.batches.append(tuple(queues))
        return super().scan_many(queues, batch, now_ms)

    def scan(self, queue: str, batch: int, now_ms: int | None = None) -> Scan:
        self.alone.append((queue, time.monotonic()))
        return super().scan(queue, batch, now_ms)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[redis.cluster.RedisCluster]:
    made = cluster.client()
    try:
        yield made
    finally:
        made.close()


def bridge_lines(
    caplog: pytest.LogCaptureFixture, logger: str, start: str = ""
) -> list[logging.LogRecord]:
    """The WARNING (and higher) lines of `logger`, those starting with `start`."""
    return [
        r
        for r in caplog.records
        if r.name == logger and r.levelno >= logging.WARNING and r.getMessage().startswith(start)
    ]


def test_a_queue_whose_slot_keeps_redirecting_is_left_out_of_each_tick_and_retried_each_second(
    cluster: Cluster, client: redis.cluster.RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="emq_bridge")
    repeat = CountedScans(client, "s32")
    moving = repeat.keys(MOVING)
    assert key_slot(moving.registry.encode()) not in {
        key_slot(repeat.keys(q).registry.encode()) for q in HEALTHY
    }
    for queue in HEALTHY:
        repeat.register(queue, "beat", every_ms=200, template={"task": "t"})
    repeat.register(MOVING, "job", every="1h", template={"task": "t"})
    repeat.trigger(MOVING, "job")  # sent as soon as its slot serves again
    assert client.exists(moving.running) == 0  # the key that makes the source answer TRYAGAIN
    recorder = RecordingDispatcher()
    pump = Pump(repeat, [MOVING, *HEALTHY], recorder, max_sleep_s=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    try:
        with migrating(cluster, moving.registry):
            thread.start()
            time.sleep(HELD_S)
            batches, alone = list(repeat.batches), list(repeat.alone)
            held_lines = bridge_lines(caplog, "emq_bridge.pump", f"{MOVING}:")
            sent_while_held = {o.queue for o in recorder.occurrences}
        # The slot serves again: the queue's next retry goes through, and it rejoins.
        wait_for(lambda: MOVING in {o.queue for o in recorder.occurrences}, 10, "the trigger")
        rejoined = len(repeat.batches)
        wait_for(lambda: len(repeat.batches) > rejoined + 1, 10, "a tick more")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()

    # The first tick met the slot in its pipeline; no tick after it put the queue there.
    assert MOVING in batches[0]
    assert [b for b in batches[1:] if MOVING in b] == []
    assert all(set(b) == set(HEALTHY) for b in batches[1:])
    # Retried on its own, at most once a second, and at least twice while held.
    retries = [at for queue, at in alone if queue == MOVING]
    assert len(retries) >= 2, alone
    gaps = [later - earlier for earlier, later in pairwise(retries)]
    assert min(gaps) >= 0.9 * BROKEN_RETRY_S, gaps
    assert sent_while_held == set(HEALTHY)  # the other queues were served meanwhile

    # Told once, at WARNING: a reshard is no broken registry.
    (told,) = held_lines
    assert told.levelno == logging.WARNING
    message = told.getMessage()
    assert message.startswith(f"{MOVING}: a registry move is held up"), message
    assert "the Redis Cluster kept redirecting" in message and "TTL exhausted" in message
    assert "retried every second" in message
    # Then its recovery, once; and it rejoined the pipeline.
    after = bridge_lines(caplog, "emq_bridge.pump", f"{MOVING}:")[len(held_lines) :]
    assert [r.getMessage() for r in after] == [
        f"{MOVING}: registry moves succeed again; pumping resumes"
    ]
    assert MOVING in repeat.batches[-1]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_registry_watch_tells_a_cluster_that_kept_redirecting_without_a_traceback(
    cluster: Cluster, client: redis.cluster.RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="emq_bridge.resync")
    repeat = Repeat(client, "s32-watch")
    repeat.register(MOVING, "job", every="1h", template={"task": "t"})
    keys = repeat.keys(MOVING)
    assert client.exists(keys.synced) == 0  # the key that makes the source answer TRYAGAIN
    watch = RegistryWatch(repeat, [MOVING], [], list, check_s=0.1, spread_s=0)
    with migrating(cluster, keys.registry):
        with pytest.raises(RegistryError) as caught:  # `RegistryRedirected`, the line says
            watch.present()
        assert not isinstance(caught.value, RegistryUnavailable)  # no outage: the watch warns
        watch.start()
        try:

            def told() -> bool:
                watch.on_tick(Tick())  # its pump ticks: checks are made
                return bool(bridge_lines(caplog, "emq_bridge.resync"))

            wait_for(told, 10, "the watch's failed check")
        finally:
            watch.stop()
    (line,) = bridge_lines(caplog, "emq_bridge.resync")
    assert line.levelno == logging.WARNING
    assert not line.exc_info  # the message says it all: no redis-py traceback
    assert line.getMessage().startswith(
        "emq-bridge: the registry watch failed; it tries again at its next check: "
        "RegistryRedirected: watch the registry: the Redis Cluster kept redirecting"
    ), line.getMessage()
