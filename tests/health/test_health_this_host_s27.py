"""`emq-bridge health --this-host`: the liveness probe of one pump where several, on other
hosts, serve its queue. Without it the probe is per queue, so another host's live pump kept
the probe of a frozen one passing (session 27's probe: a SIGSTOPped pump beside a live one,
exit 0 for 40 s, so Kubernetes never restarts it)."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading

from processes import EMQ_BRIDGE, run_cli, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

TIMEOUT_S = 30
PROBE = ("health", "--queue", "reports", "--max-lag", "5m")


def test_this_host_counts_only_its_own_pumps(redis_url: str, prefix: str, repeat: Repeat) -> None:
    repeat.register("reports", "digest", every="1h", template={"task": "digest"})
    # A pump of another host: its heartbeat names that host.
    elsewhere = Pump(repeat, ["reports"], RecordingDispatcher())
    elsewhere.heartbeat.host = "another-host"
    stop = threading.Event()
    thread = threading.Thread(target=elsewhere.run, args=(stop,), daemon=True)
    thread.start()
    here: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: repeat.pumps(["reports"]), TIMEOUT_S, "the other host's heartbeat")
        assert run_cli(redis_url, prefix, *PROBE).returncode == 0  # the queue is served
        alone = run_cli(redis_url, prefix, *PROBE, "--this-host")
        assert alone.returncode == 4, alone.stdout
        assert alone.stderr.strip().splitlines() == [
            f"unhealthy: no live pump of host {socket.gethostname()!r} serves queue 'reports' "
            "(1 live pump(s) of other hosts not counted)"
        ]
        here = subprocess.Popen(
            [
                *(EMQ_BRIDGE, "--redis-url", redis_url, "--prefix", prefix, "pump", "reports"),
                *("--list-key", f"{prefix}:out", "--max-sleep", "0.2", "--heartbeat-ttl", "1.5"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pid = here.pid
        wait_until(lambda: pid in {p.pid for p in repeat.pumps(["reports"])}, TIMEOUT_S, "its pump")
        assert run_cli(redis_url, prefix, *PROBE, "--this-host").returncode == 0
        here.send_signal(signal.SIGSTOP)  # frozen: alive, not ticking, its heartbeat expires
        gone = lambda: pid not in {p.pid for p in repeat.pumps(["reports"])}  # noqa: E731
        wait_until(gone, TIMEOUT_S, "its heartbeat expiring")
        assert run_cli(redis_url, prefix, *PROBE).returncode == 0  # still served elsewhere
        frozen = run_cli(redis_url, prefix, *PROBE, "--this-host")
        assert frozen.returncode == 4 and "no live pump of host" in frozen.stderr
    finally:
        stop.set()
        thread.join(TIMEOUT_S)
        if here is not None:
            here.send_signal(signal.SIGCONT)
            here.kill()
            here.wait(TIMEOUT_S)
