"""A stop signal while the broker hangs: what the hung-broker stop tests of `emq-bridge pump`
and `celery beat -S emq` share."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import redis
from processes import wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.dispatch import ListPushDispatcher
from emq_bridge.embedded import EmbeddedServer

HOUR = 3_600_000


def stop_while_hung(
    repeat: Repeat,
    broker: EmbeddedServer,
    process: subprocess.Popen[Any],
    queue: str,
    task: str,
    due: int,
    then: Any = None,
) -> float:
    """Stop `broker`'s process (it hangs: no answer, no reset), make `due` hourly schedules of
    `task` in `queue` due, wait until `process`'s pump claimed some (its send then blocks),
    SIGTERM `process`; return the seconds it took to exit. The broker goes on after."""
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        definition = define(every="1h", template={"task": task})
        now = repeat.server_time_ms()
        repeat.upsert_many(
            [(queue, f"job-{i:04d}", definition) for i in range(due)], now_ms=now - HOUR
        )
        wait_until(lambda: repeat.leases(queue), 30, "the pump's claim", then=then)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        process.wait(timeout=60)
        return time.monotonic() - stopping
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)


def assert_handed_back(
    repeat: Repeat, client: redis.Redis, prefix: str, queue: str, due: int
) -> list[str]:
    """Nothing of `queue` waits out a lease, the next pump sends what was handed back at once
    (redelivered), and every one of the `due` occurrences fired. Returns the ids it sent."""
    now = repeat.server_time_ms()
    assert [lease for lease in repeat.leases(queue) if lease[2] > now] == []
    out_key = f"{prefix}:rescued"
    rescued = Pump(repeat, [queue], ListPushDispatcher(client, out_key)).run_once()
    # The batch in hand was handed back (redelivered); the rest of the due ones were never
    # claimed (the stopping pump claimed nothing more).
    assert any(o.redelivered for o in rescued.dispatched), "nothing was handed back"
    assert repeat.leases(queue) == []
    fired = sum(r.fired for r in repeat.list(queue))
    assert fired == due, fired
    return [o.id for o in rescued.dispatched]
