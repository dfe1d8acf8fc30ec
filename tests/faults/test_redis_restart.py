"""Redis restarts: the server is SIGKILLed mid-run and restarted from its AOF.

The pump (`Pump.run` in a thread) must log the outage once, reconnect with backoff and
resume; every registration must survive; the slots missed during the outage follow the
misfire policy: coalesced (fired once, the rest counted in `missed`) by default, fired one
by one under `catchup`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from emq_bridge import Pump, Repeat, define
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.testing import RecordingDispatcher

from .conftest import free_port

pytestmark = pytest.mark.faults

QUEUE = "restart"
EVERY_MS = 1_000
COALESCED = 40
OUTAGE_S = 3.0


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `condition`; return the seconds it took, or fail after `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


def test_a_pump_rides_out_a_redis_crash_and_restart_with_aof_logging_the_outage_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, report: Callable[[str], None]
) -> None:
    caplog.set_level(logging.INFO, logger="emq_bridge")
    server = EmbeddedServer(
        port=free_port(),
        directory=str(tmp_path),
        # `always`: every write the pump was told succeeded survives the crash. With
        # `everysec` the last second of claims may be lost, and the counts compared below
        # (missed vs the slots seen dispatched) then differ by what the server forgot.
        extra_args=["--appendonly", "yes", "--appendfsync", "always"],
    ).start()
    client = redis.Redis.from_url(server.url)
    repeat = Repeat(client, "rs")
    coalesce = define(every_ms=EVERY_MS, template={"task": "coalesced"})
    catchup = define(every_ms=EVERY_MS, misfire="catchup", template={"task": "caught-up"})
    items = [(QUEUE, f"c{i}", coalesce) for i in range(COALESCED)] + [(QUEUE, "catchup", catchup)]
    assert set(repeat.upsert_many(items)) == {"created"}
    before = {name: client.hgetall(repeat.keys(QUEUE).record(name)) for _, name, _ in items}

    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, [QUEUE], dispatcher, lease_ms=2_000, max_sleep_s=0.5)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: len(dispatcher.names()) >= 2 * len(items), 15, "two rounds before the crash"
        )
        server.kill()
        time.sleep(OUTAGE_S)
        fired_before_restart = len(dispatcher.names())
        server.start()
        restarted_at = time.monotonic()
        recovery_s = wait_for(
            lambda: len(dispatcher.names()) > fired_before_restart,
            30,
            "the first dispatch after restart",
        )
        # Two more full rounds after the restart, so every registration shows its catch-up.
        target = len(dispatcher.names()) + 2 * len(items)
        wait_for(lambda: len(dispatcher.names()) >= target, 15, "two rounds after the restart")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()

    # No registration was lost, and none lost its definition.
    after = {name: client.hgetall(repeat.keys(QUEUE).record(name)) for _, name, _ in items}
    for name, fields in before.items():
        assert after[name][b"digest"] == fields[b"digest"], name
    assert client.zcard(repeat.keys(QUEUE).registry) == len(items)
    registrations = {r.name: r for r in repeat.list(QUEUE)}
    client.close()
    server.stop()

    # The outage is logged once, and its end once; not a line per tick.
    pump_records = [r for r in caplog.records if r.name == "emq_bridge.pump"]
    assert sum("unreachable" in r.getMessage() for r in pump_records) == 1
    assert sum("reachable again" in r.getMessage() for r in pump_records) == 1
    assert [
        r
        for r in pump_records
        if r.levelno >= logging.ERROR and "unreachable" not in r.getMessage()
    ] == []

    fresh: dict[str, list[int]] = defaultdict(list)
    fired: dict[str, list[int]] = defaultdict(list)
    for occurrence in dispatcher.occurrences:
        fired[occurrence.name].append(occurrence.due_ms)
        if not occurrence.redelivered:
            fresh[occurrence.name].append(occurrence.due_ms)
    coalesced_missed = 0
    for name, all_dues in fired.items():
        assert fresh[name] == sorted(set(fresh[name])), f"{name} fired a slot twice as fresh"
        dues = sorted(set(all_dues))  # a claim whose reply the crash cut is re-dispatched
        steps = [b - a for a, b in itertools.pairwise(dues)]
        assert all(step % EVERY_MS == 0 for step in steps), f"{name} left its grid"
        registration = registrations[name]
        skipped = sum(step // EVERY_MS - 1 for step in steps)
        if name == "catchup":
            assert set(steps) == {EVERY_MS}, "catchup must fire every missed slot"
            assert registration.missed == 0
        else:
            assert skipped >= 1, f"{name} fired every slot through a {OUTAGE_S}s outage"
            assert registration.missed == skipped, f"{name}: missed slots not counted"
            coalesced_missed += skipped
    assert set(fired) == {name for _, name, _ in items}
    report(
        f"\nredis restart: outage {OUTAGE_S:.1f}s, "
        f"first dispatch {recovery_s:.2f}s after the restart "
        f"({time.monotonic() - restarted_at:.1f}s to two more full rounds), "
        f"{coalesced_missed} slots coalesced over {COALESCED} registrations, "
        f"{len(fired['catchup'])} catch-up slots all fired"
    )
