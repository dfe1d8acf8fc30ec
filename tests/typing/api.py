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


def use_adapters() -> None:
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.stub import StubBroker

    from emq_bridge.celery import CeleryDispatcher, RepeatScheduler, nominal_due_ms
    from emq_bridge.celery import recurring as celery_recurring
    from emq_bridge.dispatch import PumpTarget
    from emq_bridge.dramatiq import DramatiqDispatcher, RecurringMiddleware, load_target, recurring

    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(run_pump=False))

    @recurring(every="15m")
    @dramatiq.actor(broker=broker, queue_name="reports")
    def refresh() -> None: ...

    app = Celery("proj")

    @celery_recurring(cron="0 9 * * *", tz="Europe/Paris")
    @app.task  # type: ignore[untyped-decorator]  # celery ships no type hints; ours are checked
    def digest() -> None: ...

    target: PumpTarget = load_target("proj:broker")
    print(
        target, CeleryDispatcher(app), DramatiqDispatcher(broker), RepeatScheduler, nominal_due_ms
    )
