"""`emq-bridge health` against real CLI processes, on two registries a user breaks by hand.

A queue named with `--queue` whose registry was wiped (its keys deleted, the database
flushed) while its pump still heartbeats said `ok` and exited 0, where `health` without
`--queue` said that no queue has a registry (exit 4): a named queue with no registry at all
is unhealthy too. A queue that still has a registry, every schedule paused or past its end,
stays healthy while a pump serves it.

A queue key the scan reads (its registry, leases or running set) holding another type exited
3 with the script's raw WRONGTYPE (its SHA and `@user_script` line) and no key named; it
names the key now, as `emq-bridge pumps` does for a pump table of the wrong type.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import redis
from processes import EMQ_BRIDGE, run_cli, stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TIMEOUT_S = 30


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The one line a failing `health` printed on stderr, having exited `code`."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def pump(redis_url: str, prefix: str) -> Iterator[subprocess.Popen[bytes]]:
    """A CLI pump process serving `reports`, with a short heartbeat; stopped at the end."""
    process = subprocess.Popen(
        [
            *(EMQ_BRIDGE, "--redis-url", redis_url, "--prefix", prefix, "pump", "reports"),
            *("--list-key", f"{prefix}:out", "--max-sleep", "0.2", "--heartbeat-ttl", "1.5"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        stop(process)


def live(repeat: Repeat, process: subprocess.Popen[bytes]) -> bool:
    return process.pid in {p.pid for p in repeat.pumps(["reports"])}


def test_health_of_a_named_queue_whose_registry_was_wiped_fails_while_its_pump_lives(
    redis_url: str, prefix: str, repeat: Repeat, pump: subprocess.Popen[bytes]
) -> None:
    repeat.register("reports", "digest", every="1m", template={"task": "digest"})
    wait_until(lambda: live(repeat, pump), TIMEOUT_S, "the pump's heartbeat")
    healthy = run_cli(redis_url, prefix, "health", "--queue", "reports")
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.startswith("ok: 1 queue(s), 1 live pump(s)")

    # A FLUSHDB of the test's prefix (the server is shared): every key of it goes, and the
    # pump, still running, writes its heartbeat again.
    for key in list(repeat.client.scan_iter(match=f"{prefix}:*", count=1000)):
        repeat.client.delete(key)
    wait_until(lambda: live(repeat, pump), TIMEOUT_S, "the pump's next heartbeat")
    assert [k.decode() for k in repeat.client.scan_iter(match=f"{prefix}:*")] == [
        repeat.keys("reports").pumps
    ]

    everything = run_cli(redis_url, prefix, "health")
    assert one_line(everything, 4) == (
        f"unhealthy: no queue has a registry under prefix '{prefix}': nothing is served"
    )
    named = run_cli(redis_url, prefix, "health", "--queue", "reports")
    line = one_line(named, 4)
    assert line.startswith(f"unhealthy: queue 'reports' has no registry under prefix '{prefix}'")
    assert line.endswith("its 1 live pump(s) have nothing to fire")
    assert named.stdout == ""
    as_json = run_cli(redis_url, prefix, "health", "--queue", "reports", "--json")
    assert as_json.returncode == 4
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["reason"] == line.removeprefix("unhealthy: ")
    [queue] = report["queues"]
    assert queue["queue"] == "reports" and len(queue["pumps"]) == 1
    # Several queues named: the one without a registry fails the probe.
    repeat.register("other", "job", every="1m", template={"task": "t"})
    Pump(repeat, ["other"], RecordingDispatcher()).heartbeat.write(repeat)
    both = run_cli(redis_url, prefix, "health", "--queue", "other", "--queue", "reports")
    assert "queue 'reports' has no registry" in one_line(both, 4)

    # Registered again: served again.
    repeat.register("reports", "digest", every="1m", template={"task": "digest"})
    again = run_cli(redis_url, prefix, "health", "--queue", "reports")
    assert again.returncode == 0, again.stderr


def test_health_of_a_named_queue_with_a_registry_of_paused_or_ended_schedules_passes(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    # Nothing will run, yet the queue has its registry: not "no registry".
    repeat.register("reports", "digest", every="1m", template={"task": "digest"})
    repeat.pause("reports", "digest")
    repeat.register("ended", "once", every="1m", limit=1, immediately=True, template={"task": "t"})
    Pump(repeat, ["ended"], RecordingDispatcher()).run_once()  # its one run: it completes
    ended = repeat.get("ended", "once")
    assert ended is not None and ended.completed is not None
    pump = Pump(repeat, ["reports", "ended"], RecordingDispatcher())
    pump.heartbeat.write(repeat)
    try:
        for queue in ("reports", "ended"):
            done = run_cli(redis_url, prefix, "health", "--queue", queue)
            assert done.returncode == 0, done.stderr
        said = run_cli(redis_url, prefix, "health", "--queue", "reports", "--json")
        report = json.loads(said.stdout)
        assert report["ok"] is True and report["queues"][0]["earliest_ms"] is None
        # Neither a registry nor a pump: both are said.
        nobody = run_cli(redis_url, prefix, "health", "--queue", "nobody")
        assert one_line(nobody, 4) == (
            "unhealthy: no live pump serves queue 'nobody', which has no registry under "
            f"prefix '{prefix}'"
        )
    finally:
        pump.heartbeat.remove(repeat)


@pytest.mark.parametrize(
    ("which", "args"),
    [
        ("leases", ()),
        ("leases", ("--queue", "reports")),
        ("leases", ("--queue", "reports", "--json")),
        ("running", ()),
        ("running", ("--queue", "reports")),
        # A registry of another type is no queue to `health` without --queue (it finds the
        # queues by their sorted sets): named, it is read, and refused.
        ("registry", ("--queue", "reports")),
    ],
)
def test_health_names_a_queue_key_of_the_wrong_type_and_exits_3(
    redis_url: str, prefix: str, repeat: Repeat, which: str, args: tuple[str, ...]
) -> None:
    repeat.register("reports", "digest", every="1m", template={"task": "digest"})
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    pump.heartbeat.write(repeat)
    key = getattr(repeat.keys("reports"), which)
    client: redis.Redis = repeat.client
    try:
        assert run_cli(redis_url, prefix, "health", *args).returncode == 0
        client.delete(key)
        client.set(key, "x")  # `redis-cli SET <key> x`

        done = run_cli(redis_url, prefix, "health", *args)
        line = one_line(done, 3)
        assert line.startswith("Error: Redis at ")
        assert (
            f"refused: scan reports: WRONGTYPE key '{key}' holds a string, not a sorted set"
        ) in line
        assert "user_script" not in line and "script:" not in line  # no Lua internals
        assert done.stdout == ""
    finally:
        client.delete(key)
        pump.heartbeat.remove(repeat)
