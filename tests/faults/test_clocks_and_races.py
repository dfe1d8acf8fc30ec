"""One clock, and no duplicated registration under racing writers.

Due decisions use the Redis server's `TIME`, so a pump on a host whose clock is a day off
fires nothing early and nothing late. Registering the same names from many clients at once
gives one record and one registry member per name, and exactly one `created`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis
from quiet import quiet_offset

from emq_bridge import Pump, Repeat, define
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.testing import RecordingDispatcher

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("skew_s", [86_400, -86_400], ids=["a day ahead", "a day behind"])
def test_a_pump_on_a_host_with_a_wrong_clock_fires_on_the_server_clock(
    own_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, skew_s: int
) -> None:
    client = redis.Redis.from_url(own_server.url)
    repeat = Repeat(client, "clock")
    # Half a minute from its next slot (on the real clock, before it is skewed): a minute
    # turning while the pump ticks would fire `minutely` next to `fast`.
    offset = quiet_offset("1m")
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)
    repeat.register("q", "minutely", every_ms=60_000, offset=offset)
    repeat.register("q", "fast", every_ms=200)
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher)

    deadline = real_time() + 10
    while "fast" not in dispatcher.names() and real_time() < deadline:
        pump.run_once()
        time.sleep(0.05)

    assert dispatcher.names() == ["fast"]
    registration = repeat.get("q", "minutely")
    assert registration is not None and registration.next_run_ms is not None
    assert 0 < registration.next_run_ms - repeat.server_time_ms() <= 60_000
    client.close()


def test_racing_registrations_of_the_same_names_give_one_record_each(
    own_server: EmbeddedServer,
) -> None:
    names = [f"n{i}" for i in range(200)]
    definition = define(every="1h", template={"task": "t"})
    results: list[str] = []
    lock = threading.Lock()

    def writer(index: int) -> None:
        client = redis.Redis.from_url(own_server.url)
        repeat = Repeat(client, "race")
        for name in names if index % 2 else reversed(names):
            if index % 3:
                outcome: str = repeat.upsert("q", name, definition=definition)
            else:
                outcome = repeat.register("q", name, definition=definition)
            with lock:
                results.append(outcome)
        client.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    client = redis.Redis.from_url(own_server.url)
    repeat = Repeat(client, "race")
    created = Counter(results)["created"] + Counter(results)["registered"]
    assert created == len(names)
    assert Counter(results)["updated"] == 0
    assert client.zcard(repeat.keys("q").registry) == len(names)
    assert sorted(r.name for r in repeat.list("q")) == sorted(names)
    client.close()
