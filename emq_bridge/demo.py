"""A self-contained demo: an embedded server, a few schedules, and the pump firing them.

Run it with `python -m emq_bridge.demo`. (The Dramatiq integration turns this into a demo
with a real Dramatiq worker.)
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import redis

from .embedded import redis_url
from .pump import Pump
from .registry import Occurrence, Repeat


class PrintingDispatcher:
    def __init__(self) -> None:
        self.count = 0

    def dispatch(self, occurrence: Occurrence) -> None:
        self.count += 1
        due = datetime.fromtimestamp(occurrence.due_ms / 1000, tz=timezone.utc).strftime(
            "%H:%M:%S.%f"
        )[:-3]
        print(f"  fired {occurrence.queue}/{occurrence.name:<10} due {due} UTC  id {occurrence.id}")


def main(seconds: float = 6.0) -> None:
    with redis_url() as url:
        repeat = Repeat(redis.Redis.from_url(url), prefix="demo")
        for name, every in (("heartbeat", "1s"), ("digest", "2s"), ("report", "3s")):
            result = repeat.register("demo", name, every=every, template={"task": name})
            print(f"register demo/{name} every {every}: {result}")
        dispatcher = PrintingDispatcher()
        pump = Pump(repeat, ["demo"], dispatcher)
        worker = threading.Thread(target=pump.run, daemon=True)
        worker.start()
        time.sleep(seconds)
        pump.stop()
        worker.join()
        print(f"{dispatcher.count} occurrences fired in {seconds:.0f}s")


if __name__ == "__main__":
    main()
