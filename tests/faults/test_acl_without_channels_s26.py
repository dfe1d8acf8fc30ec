"""A Redis user that may not use the registry's wake-up channels (an ACL without
`&<prefix>:*`, the default for a new user on Redis 7 and Valkey) gets every move right and a
pump that polls (found by a probe, session 26).

Before, each move published its wake-up after its writes with `redis.call`, so the script
stopped there: `add`, `pause`, `trigger` wrote and then failed (a trigger retried fired
twice); and a pump whose SUBSCRIBE was refused subscribed again at every tick, its sleep
ending at once: about a thousand ticks a second, and nothing logged. A real server with a
real ACL user.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from processes import run_app_cli

from emq_bridge import Pump, PumpEvents, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.pump import Tick
from emq_bridge.testing import RecordingDispatcher

PREFIX = "acl"


@pytest.fixture
def channelless() -> Iterator[Repeat]:
    """A registry reached as a user with the prefix's keys and no channel."""
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "nochan",
            "on",
            ">pw",
            "resetchannels",
            f"~{PREFIX}:*",
            "+@all",
            "-@dangerous",
        )
        client = redis.Redis(port=server.port, username="nochan", password="pw")
        try:
            yield Repeat(client, PREFIX)
        finally:
            client.close()
            admin.close()


def test_every_move_is_whole_without_the_channels(channelless: Repeat) -> None:
    repeat = channelless
    repeat.upsert("q", "job", every="1h", template={"task": "t"})
    assert repeat.pause("q", "job")
    assert repeat.resume("q", "job")
    repeat.trigger("q", "job")
    leases = repeat.leases("q")
    assert [member for member, _, _ in leases] == ["job"] and len(leases) == 1
    (sent,) = Pump(repeat, ["q"], RecordingDispatcher()).run_once().dispatched
    assert sent.triggered


class Ticks(PumpEvents):
    def __init__(self) -> None:
        self.count = 0

    def on_tick(self, tick: Tick) -> None:
        self.count += 1


def test_a_pump_refused_its_subscription_polls_and_says_so_once(
    channelless: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    channelless.upsert("q", "hourly", every="1h", template={"task": "t"})
    ticks = Ticks()
    pump = Pump(channelless, ["q"], RecordingDispatcher(), max_sleep_s=0.5, listeners=[ticks])
    stop = threading.Event()
    runner = threading.Thread(target=pump.run, args=(stop,))
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        runner.start()
        time.sleep(3)
        stop.set()
        runner.join(10)
    assert not runner.is_alive()
    assert ticks.count <= 12, f"{ticks.count} ticks in 3 s: a busy loop"  # 0.5 s sleeps: ~6
    refused = [r for r in caplog.records if "wake-ups are off" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]


APP = """
from celery import Celery

app = Celery("acls26", broker="amqp://guest:guest@127.0.0.1:5672//")
app.conf.update(
    result_backend=None,
    emq_bridge_redis_url="redis://docs:pw@127.0.0.1:{port}/0",
    emq_bridge_prefix="{prefix}",
    beat_schedule={{"tick": {{"task": "celery.backend_cleanup", "schedule": 60.0}}}},
)
"""


def test_the_apps_server_by_another_name_is_recognised_without_info(tmp_path: Path) -> None:
    # The ACL the guarantees guide names: INFO is refused (-@dangerous), so the server's
    # run_id cannot say that `localhost` is the app's `127.0.0.1`; before, the pump refused
    # its own registry (exit 2). Found by a probe, session 26.
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "docs",
            "on",
            ">pw",
            f"~{PREFIX}:*",
            f"&{PREFIX}:*",
            "+@all",
            "-@dangerous",
        )
        (tmp_path / "acls26.py").write_text(APP.format(port=server.port, prefix=PREFIX))
        other_name = f"redis://docs:pw@localhost:{server.port}/0"
        done = run_app_cli(
            tmp_path, "--redis-url", other_name, "pump", "--celery", "acls26", "--once"
        )
        assert done.returncode == 0, done.stderr
        assert admin.exists(f"{PREFIX}:{{celery}}:repeat:tick")
        assert list(admin.scan_iter(match=f"{PREFIX}:same-server:*")) == []  # cleaned up
        admin.close()
