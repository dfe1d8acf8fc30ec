"""Type-checked use of the public API (mypy --strict runs over this file; it is not a test)."""

from __future__ import annotations

import redis

from emq_bridge import Occurrence, Pump, Registered, Registration, Repeat, Upserted, define
from emq_bridge.testing import ManualClock, RecordingDispatcher


def use_api(client: redis.Redis) -> None:
    repeat = Repeat(client)
    registered: Registered = repeat.register(
        "reports", "digest", every_ms=900_000, template={"task": "t"}
    )
    upserted: Upserted = repeat.upsert(
        "reports", "nightly", cron="0 9 * * *", tz="Europe/Paris", template={}
    )
    also: Upserted = repeat.upsert("reports", "x", definition=define(every="15m"), source="app")
    found: Registration | None = repeat.get("reports", "digest")
    runs: list[int] = repeat.next_runs("reports", "nightly", n=5)
    cancelled: bool = repeat.cancel("reports", "digest")
    clock = ManualClock(0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], recorder, clock=clock)
    fired: list[Occurrence] = pump.run_once().dispatched
    print(registered, upserted, also, found, runs, cancelled, fired)
