"""Type-checked use of the public API (mypy --strict runs over this file; it is not a test)."""

from __future__ import annotations

import redis

from emq_bridge import (
    Occurrence,
    Pump,
    PumpEvents,
    Registered,
    Registration,
    Repeat,
    TaskTemplate,
    Tick,
    Upserted,
    define,
)
from emq_bridge.testing import ManualClock, RecordingDispatcher


class Counts(PumpEvents):
    def __init__(self) -> None:
        self.sent = 0

    def on_dispatch(self, occurrence: Occurrence) -> None:
        self.sent += 1

    def on_tick(self, tick: Tick) -> None:
        print(tick.now_ms, len(tick.dispatched))


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
    pump = Pump(repeat, ["reports"], recorder, clock=clock, listeners=[Counts()])
    pump.add_listener(Counts())
    fired: list[Occurrence] = pump.run_once().dispatched
    template = TaskTemplate("reports.digest", [1], {"full": True}).to_dict()
    read: TaskTemplate = TaskTemplate.read(template)
    with Repeat.from_url("redis://127.0.0.1:6379/0") as owned:
        wakeups = owned.subscribe(["reports"])
        changed: bool = wakeups.wait(0.1)
        wakeups.close()
    print(registered, upserted, also, found, runs, cancelled, fired, read, changed)


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

    # The actor keeps its type through the decorator; a plain function (the decorator placed
    # below `@dramatiq.actor`, or without it) is a type error, as it is a `ScheduleError`.
    sent: dramatiq.Message[None] = refresh.send()

    @recurring(every="15m")  # type: ignore[type-var]
    def not_an_actor() -> None: ...

    # Dramatiq cannot revoke a message that runs: `replace` is no policy of its decorator.
    recurring(every="15m", overlap="replace")  # type: ignore[arg-type]

    app = Celery("proj")

    @celery_recurring(cron="0 9 * * *", tz="Europe/Paris")
    @app.task  # type: ignore[untyped-decorator]  # celery ships no type hints; ours are checked
    def digest() -> None: ...

    target: PumpTarget = load_target("proj:broker")
    print(
        target, CeleryDispatcher(app), DramatiqDispatcher(broker), RepeatScheduler, nominal_due_ms
    )
    print(sent, not_an_actor)
