"""One workload of `python -m bench.instructions`, run under callgrind (`bench/instructions.py`).

Self-contained (stdlib, emq_bridge, celery, dramatiq, redis-py; nothing of `bench`), so that
the emq_bridge it measures is whichever tree `PYTHONPATH` names first:

    python bench/instructions_child.py WORKLOAD N WORK|SETUP

`SETUP` builds everything the workload needs for N and stops; `WORK` then does the work too,
so the difference of the two counts is the work's own.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

TASK = "bench_noop"
QUEUE = "bench"


def bench_noop(*args: Any, **kwargs: Any) -> None:
    """The task and actor every workload declares."""


def _template(i: int) -> dict[str, Any]:
    return {
        "task": TASK,
        "args": [i, 2],
        "kwargs": {"report": "daily", "tenant": f"t{i:07d}", "limit": 100},
    }


def beat_schedule(n: int, work: bool) -> None:
    """`app_schedule` of an n-entry `beat_schedule` (what `celery beat -S emq` converts)."""
    from celery import Celery

    from emq_bridge.celery import app_schedule

    app = Celery("bench", broker="memory://", set_as_current=False)
    app.task(name=TASK)(bench_noop)
    app.conf.beat_schedule = {
        f"job-{i:07d}": {
            "task": TASK,
            "schedule": timedelta(hours=1),
            "args": _template(i)["args"],
            "kwargs": _template(i)["kwargs"],
        }
        for i in range(n)
    }
    if work:
        app_schedule(app)


def schedule_file(n: int, work: bool) -> None:
    """Validating an n-entry schedule file's document (`emq-bridge sync FILE` after its
    parser: the TOML or JSON reader is not counted)."""
    from emq_bridge import config

    data = {
        "source": "bench-file",
        "queue": QUEUE,
        "schedule": [{"name": f"job-{i:07d}", "every": 3600, **_template(i)} for i in range(n)],
    }
    if work:
        config._parse(data, Path("schedules.toml"))


def dramatiq_drain(n: int, work: bool) -> None:
    """A `Pump` drains n due registrations through `PipelinedDramatiqDispatcher` (what a
    worker's `RecurringMiddleware` pump thread runs): the pump's own instructions, not the
    server's (it runs outside valgrind)."""
    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge import Pump, Repeat, define
    from emq_bridge.definition import Declaration
    from emq_bridge.dramatiq.dispatch import PipelinedDramatiqDispatcher
    from emq_bridge.embedded import EmbeddedServer
    from emq_bridge.occurrence import Occurrence
    from emq_bridge.sync import sync

    with EmbeddedServer() as server:
        broker = RedisBroker(url=server.url.rsplit("/", 1)[0] + "/1")
        dramatiq.set_broker(broker)
        dramatiq.actor(actor_name=TASK)(bench_noop)
        dispatcher = PipelinedDramatiqDispatcher(broker)
        dispatcher.dispatch(Occurrence(QUEUE, "warm-up", 0, str(uuid.uuid4()), _template(0), 0))
        client = redis.Redis.from_url(server.url)
        repeat = Repeat(client, "emq")
        declared = [
            Declaration(QUEUE, f"job-{i:07d}", define(every_ms=3_600_000, template=_template(i)))
            for i in range(n)
        ]
        sync(repeat, declared, "bench")
        key = repeat.keys(QUEUE).registry
        due = repeat.server_time_ms() - 10
        names = client.zrange(key, 0, -1)
        for start in range(0, len(names), 1000):
            client.zadd(key, {m: due for m in names[start : start + 1000]})
        if not work:
            return
        pump = Pump(repeat, [QUEUE], dispatcher)

        def stop_when_drained() -> None:
            while client.zcount(key, 0, due) > 0:
                time.sleep(0.05)
            pump.stop()

        threading.Thread(target=stop_when_drained, daemon=True).start()
        pump.run()


WORKLOADS = {
    "beat_schedule": beat_schedule,
    "schedule_file": schedule_file,
    "dramatiq_drain": dramatiq_drain,
}

if __name__ == "__main__":
    name, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    WORKLOADS[name](count, mode == "WORK")
