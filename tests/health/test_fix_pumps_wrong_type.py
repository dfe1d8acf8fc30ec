"""`emq-bridge pumps` on a pump table of the wrong type (edited by hand) exits 3 and names the
key, as `health` and `pumps QUEUE` do; it said "no live pump serves prefix ..." and exited 0,
since its SCAN for pump tables read hashes only and so never saw the broken key."""

from __future__ import annotations

import json

import pytest
import redis
from cli_runs import cli_runner, one_error_line

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher


@pytest.mark.parametrize("as_json", [(), ("--json",)], ids=["table", "json"])
def test_pumps_exits_3_naming_a_pump_table_of_the_wrong_type(
    redis_url: str, prefix: str, as_json: tuple[str, ...]
) -> None:
    client = redis.Redis.from_url(redis_url)
    repeat = Repeat(client, prefix)
    repeat.register("qa", "job", every="1m", template={"task": "t"})
    pump = Pump(repeat, ["ok"], RecordingDispatcher())
    pump.heartbeat.write(repeat)  # a live pump of another queue, in a good table
    run = cli_runner(redis_url, prefix)
    assert [p["id"] for p in json.loads(run("pumps", "--json").stdout)] == [pump.heartbeat.id]
    key = f"{prefix}:{{qa}}:pumps"
    client.set(key, "x")

    listing = one_error_line(run("pumps", *as_json), 3)
    assert "WRONGTYPE" in listing and key in listing
    assert "no live pump" not in listing
    # The same refusal as the probe's and as the listing of that one queue.
    for args in (("health",), ("pumps", "qa", *as_json)):
        line = one_error_line(run(*args), 3)
        assert "WRONGTYPE" in line and key in line
    # Pumps and probes that name their queues never read it: a broken key stops none of them.
    assert [p.id for p in repeat.pumps(["ok"])] == [pump.heartbeat.id]
    assert [p.id for p in repeat.pumps()] == [pump.heartbeat.id]
    pump.heartbeat.remove(repeat)
    client.delete(key)
    repeat.close()
