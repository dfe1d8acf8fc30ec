"""`emq-bridge health` and `pumps` against real pump processes: the probe fails when the last
pump is killed and passes again when one starts; `list`/`show` flag what no pump serves."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from processes import EMQ_BRIDGE, run_cli

from emq_bridge import Repeat

TIMEOUT_S = 30


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


@pytest.fixture
def pumps(redis_url: str, prefix: str) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start CLI pump processes on `reports` (a short heartbeat, so a death shows fast)."""
    started: list[subprocess.Popen[str]] = []

    def start(*queues: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                EMQ_BRIDGE,
                "--redis-url",
                redis_url,
                "--prefix",
                prefix,
                "pump",
                *(queues or ("reports",)),
                "--list-key",
                f"{prefix}:out",
                "--max-sleep",
                "0.2",
                "--heartbeat-ttl",
                "1.5",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(TIMEOUT_S)
        if process.stderr is not None:
            process.stderr.close()


def states(redis_url: str, prefix: str) -> dict[str, str]:
    """The STATE column of `list`, by name."""
    rows = run_cli(redis_url, prefix, "list").stdout.splitlines()[1:]
    return {row.split()[1]: row.split()[-1] for row in rows}


def live_pids(repeat: Repeat) -> set[int]:
    return {p.pid for p in repeat.pumps(["reports"])}


def test_health_fails_when_the_last_pump_is_killed_and_passes_again_when_one_starts(
    redis_url: str, prefix: str, repeat: Repeat, pumps: Callable[..., subprocess.Popen[str]]
) -> None:
    repeat.register("reports", "digest", every="1s", template={"task": "digest"})
    first = pumps()
    wait_until(lambda: first.pid in live_pids(repeat), "the first pump's heartbeat")
    healthy = run_cli(redis_url, prefix, "health")
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.startswith("ok: 1 queue(s), 1 live pump(s)")

    listed = json.loads(run_cli(redis_url, prefix, "pumps", "--json").stdout)
    assert [(p["pid"], p["host"], p["queues"], p["role"]) for p in listed] == [
        (first.pid, socket.gethostname(), ["reports"], "pump")
    ]
    assert listed[0]["version"] == "0.1.0" and listed[0]["ticks"] >= 1
    assert listed[0]["beat_ms"] < listed[0]["expires_ms"] <= listed[0]["beat_ms"] + 1500

    first.send_signal(signal.SIGKILL)  # no goodbye: its heartbeat expires on its own
    first.wait(TIMEOUT_S)
    wait_until(lambda: run_cli(redis_url, prefix, "health").returncode != 0, "health failing", 5)
    failing = run_cli(redis_url, prefix, "health")
    assert failing.returncode == 4
    assert failing.stdout == ""
    assert failing.stderr.strip().splitlines() == ["unhealthy: no live pump serves queue 'reports'"]
    pumps_said = run_cli(redis_url, prefix, "pumps").stderr.strip()
    assert pumps_said == f"no live pump serves prefix '{prefix}'"
    # Unserved: its next run passed (more than 30 s ago) and no live pump serves its queue.
    now_ms = repeat.server_time_ms()
    repeat.register("reports", "late", every="1m", template={"task": "t"}, now_ms=now_ms - 180_000)
    wait_until(
        lambda: states(redis_url, prefix)["late"] == "unserved",
        "list flagging the schedule",
        5,
    )
    shown = run_cli(redis_url, prefix, "show", "reports", "late")
    state = "unserved: overdue, and no live pump serves its queue (emq-bridge pumps)"
    assert f"  state     {state}" in shown.stdout.splitlines()
    flags = {
        i["name"]: i["unserved"]
        for i in json.loads(run_cli(redis_url, prefix, "list", "--json").stdout)
    }
    assert flags == {"late": True, "digest": False}  # digest: due a moment ago, not yet flagged

    second = pumps()
    wait_until(lambda: second.pid in live_pids(repeat), "the second pump's heartbeat")
    assert run_cli(redis_url, prefix, "health", "--queue", "reports").returncode == 0
    wait_until(
        lambda: states(redis_url, prefix) == {"digest": "active", "late": "active"},
        "list showing active again",
        5,
    )
    assert not any(
        i["unserved"] for i in json.loads(run_cli(redis_url, prefix, "list", "--json").stdout)
    )

    second.send_signal(signal.SIGTERM)  # a pump that stops removes its heartbeat at once
    second.wait(TIMEOUT_S)
    assert second.returncode == 0
    assert repeat.pumps() == [] and not repeat.client.exists(repeat.keys("reports").pumps)


def test_health_fails_on_a_schedule_overdue_beyond_the_bound_though_a_pump_lives(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    # A pump alive but not firing (stuck, or far behind): its heartbeat without its ticks.
    from emq_bridge import Pump
    from emq_bridge.testing import RecordingDispatcher

    now_ms = repeat.server_time_ms()
    # Registered ten minutes ago and never fired: its first run is 9 to 10 minutes past.
    repeat.register("reports", "late", every="1m", template={"task": "t"}, now_ms=now_ms - 600_000)
    repeat.register("reports", "fine", every="1h", template={"task": "t"})
    stuck = Pump(repeat, ["reports"], RecordingDispatcher())
    stuck.heartbeat.write(repeat)
    late = run_cli(redis_url, prefix, "health", "--max-lag", "60s")
    assert late.returncode == 4
    assert late.stderr.startswith("unhealthy: reports/late is ")
    assert "overdue (more than 60s) although 1 pump(s) serve queue 'reports'" in late.stderr
    assert run_cli(redis_url, prefix, "health", "--max-lag", "11m").returncode == 0
    report = json.loads(run_cli(redis_url, prefix, "health", "--max-lag", "2h", "--json").stdout)
    assert report["ok"] is True and report["max_lag_ms"] == 7_200_000
    [queue] = report["queues"]
    assert queue["pumps"] == [stuck.heartbeat.id] and queue["earliest"] == "late"
    assert 480_000 < queue["overdue_ms"] < 660_000
    # Served, so not flagged: `health --max-lag` tells the stuck pump.
    assert "overdue" not in run_cli(redis_url, prefix, "list").stdout
    # Nothing due: the earliest next run is told, its name only once due (docs/health.md).
    repeat.register("later", "hourly", every="1h", template={"task": "t"})
    every = json.loads(run_cli(redis_url, prefix, "health", "--max-lag", "2h", "--json").stdout)
    later = next(q for q in every["queues"] if q["queue"] == "later")
    assert later["earliest"] is None
    assert later["earliest_ms"] > repeat.server_time_ms() - 1_000  # in the future
    assert later["overdue_ms"] == 0
    stuck.heartbeat.remove(repeat)


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (("health",), 4, "unhealthy: no queue has a registry under prefix '{prefix}'"),
        (("health", "--queue", "nobody"), 4, "unhealthy: no live pump serves queue 'nobody'"),
        (("health", "--queue", "a b"), 1, "Error: queue 'a b' must not contain whitespace"),
        (("health", "--max-lag", "soon"), 2, "'soon' is not a duration"),
        # 0 and -5 are durations, just not positive ones (they were "not a duration").
        (("health", "--max-lag", "0"), 2, "'--max-lag': must be positive, got '0'"),
        (("health", "--max-lag", "-5"), 2, "'--max-lag': must be positive, got '-5'"),
        (("health", "--max-lag", "0s"), 2, "'--max-lag': must be positive, got '0s'"),
        (("health", "--max-lag", "0.0001"), 2, "must be at least 1 ms, got '0.0001' seconds"),
        (("pumps", "a{b"), 1, "Error: queue 'a{b' must not contain"),
    ],
)
def test_health_and_pumps_exit_codes_follow_the_cli_conventions(
    redis_url: str, prefix: str, args: tuple[str, ...], code: int, line: str
) -> None:
    done = run_cli(redis_url, prefix, *args)
    assert done.returncode == code, done.stderr
    assert line.replace("{prefix}", prefix) in done.stderr
    assert done.stdout == ""


def test_health_exits_3_when_redis_is_unreachable() -> None:
    done = run_cli("redis://127.0.0.1:1/0", "emq", "health")
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1 and "cannot reach Redis" in done.stderr


def test_a_heartbeat_ttl_shorter_than_a_sleep_is_refused(redis_url: str, prefix: str) -> None:
    done = run_cli(redis_url, prefix, "pump", "q", "--list-key", "k", "--heartbeat-ttl", "1")
    assert done.returncode == 2
    assert "would expire while its pump sleeps" in done.stderr


def test_the_probe_snippet_command_is_a_real_exit_status(
    redis_url: str, prefix: str, repeat: Repeat, pumps: Callable[..., subprocess.Popen[str]]
) -> None:
    # What a Kubernetes exec probe runs: the command's status only, with REDIS_URL set.
    repeat.register("reports", "digest", every="1m", template={"task": "digest"})
    process = pumps()
    wait_until(lambda: process.pid in live_pids(repeat), "the pump's heartbeat")
    env = dict(os.environ, REDIS_URL=redis_url)
    probe = [EMQ_BRIDGE, "--prefix", prefix, "-q", "health", "--max-lag", "60s"]
    assert subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0


def test_health_fails_when_a_live_pumps_every_send_fails_and_passes_once_they_work(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    # A broker refusing every send (the list target is a string here): the claims move the
    # scores on, so nothing is overdue, yet nothing is delivered. Before, `health` said ok.
    repeat.register("reports", "fast", every="1s", template={"task": "t"})
    process = subprocess.Popen(
        [
            *(EMQ_BRIDGE, "--redis-url", redis_url, "--prefix", prefix, "pump", "reports"),
            *("--list-key", f"{prefix}:out", "--max-sleep", "0.2", "--heartbeat-ttl", "1.5"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # a traceback a failed send: not read here
    )
    try:
        # The pump refuses a target of another type at start: it turns into one once the
        # pump delivers (its first send made the list).
        wait_until(lambda: repeat.client.type(f"{prefix}:out") == b"list", "a first send")
        repeat.client.set(f"{prefix}:out", "not a list")

        def failing() -> bool:
            result = run_cli(redis_url, prefix, "health", "--max-lag", "2s")
            return result.returncode == 4 and "has failed for" in result.stderr

        wait_until(failing, "health failing on refused sends")
        line = run_cli(redis_url, prefix, "health", "--max-lag", "2s").stderr
        assert line.startswith("unhealthy: every send of the 1 pump(s) serving queue 'reports'")
        assert len(line.strip().splitlines()) == 1
        repeat.client.delete(f"{prefix}:out")  # the broker takes them again
        wait_until(
            lambda: run_cli(redis_url, prefix, "health", "--max-lag", "2s").returncode == 0,
            "health passing once a send is accepted",
        )
    finally:
        process.kill()
        process.wait(TIMEOUT_S)


def test_health_of_a_queue_whose_sends_all_fail_fails_though_its_pump_serves_another_well(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    # Before: the failing spell was the pump's, so one queue's accepted sends cleared it and
    # `health --queue bad` said ok while nothing of `bad` was delivered.
    import threading

    from emq_bridge import Occurrence, Pump
    from emq_bridge.errors import DispatchError
    from emq_bridge.heartbeat import Heartbeat

    class RefusesBad:
        def dispatch(self, occurrence: Occurrence) -> None:
            if occurrence.queue == "bad":
                raise DispatchError("the broker refuses queue bad")

    for queue in ("bad", "good"):
        repeat.register(queue, "fast", every="1s", template={"task": "t"})
    pump = Pump(repeat, ["bad", "good"], RefusesBad(), max_sleep_s=0.2)
    pump.heartbeat = Heartbeat(pump.queues, max_sleep_s=0.2, ttl_s=1.5)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    thread.start()
    try:

        def failing() -> bool:
            result = run_cli(redis_url, prefix, "health", "--queue", "bad", "--max-lag", "2s")
            return result.returncode == 4 and "has failed for" in result.stderr

        wait_until(failing, "health of queue bad failing on its refused sends")
        good = run_cli(redis_url, prefix, "health", "--queue", "good", "--max-lag", "2s")
        assert good.returncode == 0, good.stderr
    finally:
        stop.set()
        thread.join(TIMEOUT_S)
