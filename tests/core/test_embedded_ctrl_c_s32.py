"""A terminal's Ctrl-C (SIGINT to the whole foreground process group) reached the embedded
server too, so it died before the program using it had stopped: `python -m
examples.dramatiq_app` then logged a Redis outage and six CRITICAL connection errors while
its worker shut down. The server now runs in a session of its own, and the program stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import time

    import redis

    from emq_bridge.embedded import EmbeddedServer

    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            print("ready", flush=True)  # inside: a SIGINT right after it is caught too
            time.sleep(60)
        except KeyboardInterrupt:
            time.sleep(0.5)  # a worker's shutdown, still using the server
            print("after ctrl-c:", client.ping(), flush=True)
    """
)


def test_ctrl_c_stops_the_program_before_its_embedded_server() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.killpg(child.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert "after ctrl-c: True" in out, err
    assert child.returncode == 0, err
