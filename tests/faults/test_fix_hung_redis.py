"""A Redis that hangs (SIGSTOP: connections accepted, nothing answered) is told in time:
`emq-bridge health` exits 3 within its 5 s answer timeout (before: after the commands' 30 s,
past a probe's `timeoutSeconds`), a metrics scrape leaves the registrations family out after
`READ_TIMEOUT_S` instead of blocking (Prometheus's scrape timeout is 10 s), and a pump's
outage is counted from the tick that began it, not from when the socket timed out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.events import PumpEvents
from emq_bridge.metrics.registrations import RegistrationsCollector
from emq_bridge.pump import Pump
from emq_bridge.testing import RecordingDispatcher

SCRIPT = str(Path(sys.executable).parent / "emq-bridge")


@pytest.fixture
def hung() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    try:
        yield server
    finally:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def freeze(server: EmbeddedServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def thaw(server: EmbeddedServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGCONT)


def test_health_exits_3_within_its_answer_timeout_on_a_hung_server(hung: EmbeddedServer) -> None:
    Repeat.from_url(hung.url).register("reports", "d", every="1h", template={"task": "t"})
    freeze(hung)
    started = time.monotonic()
    done = subprocess.run(
        [SCRIPT, "--redis-url", hung.url, "health"], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert took < 15  # its 5 s, and a Python start: not the 30 s of the other commands


def test_a_scrape_leaves_the_family_out_when_the_server_hangs(hung: EmbeddedServer) -> None:
    repeat = Repeat(redis.Redis.from_url(hung.url, socket_timeout=30))
    repeat.register("reports", "d", every="1h", template={"task": "t"})
    collector = RegistrationsCollector(repeat, ["reports"])
    collector.read_timeout_s = 0.5
    assert [m.samples for m in collector.collect()]  # answered: the family is there
    freeze(hung)
    started = time.monotonic()
    assert list(collector.collect()) == []
    assert list(collector.collect()) == []  # the read still waiting is not doubled
    assert time.monotonic() - started < 5
    thaw(hung)
    deadline = time.monotonic() + 10
    while not list(collector.collect()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(collector.collect())


class Outages(PumpEvents):
    def __init__(self) -> None:
        self.ended: list[float] = []

    def on_outage_end(self, seconds: float) -> None:
        self.ended.append(seconds)


def test_an_outage_is_counted_from_the_tick_that_hung(hung: EmbeddedServer) -> None:
    repeat = Repeat(redis.Redis.from_url(hung.url, socket_timeout=1.0))
    repeat.register("reports", "d", every="1h", template={"task": "t"})
    outages = Outages()
    pump = Pump(repeat, ["reports"], RecordingDispatcher(), listeners=[outages])
    assert pump.step()[0] is not None
    freeze(hung)
    frozen = time.monotonic()
    assert pump.step()[0] is None  # the tick fails after the 1 s socket timeout
    time.sleep(max(0.0, 3.0 - (time.monotonic() - frozen)))
    thaw(hung)
    thawed = time.monotonic()
    tick = None
    while tick is None and time.monotonic() - thawed < 10:
        tick, _ = pump.step()
    assert tick is not None and len(outages.ended) == 1
    # About the 3 s it hung (before: from the socket timeout, about 2 s).
    assert outages.ended[0] >= thawed - frozen - 0.05


def test_the_web_view_answers_503_within_its_timeout_on_a_hung_server(
    hung: EmbeddedServer,
) -> None:
    # Before: each page waited the commands' 30 s for a hung Redis, past a probe's timeout,
    # while its requests piled up in the server's threads.
    import socket
    import urllib.error
    import urllib.request

    Repeat.from_url(hung.url).register("reports", "d", every="1h", template={"task": "t"})
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    web = subprocess.Popen(
        [SCRIPT, "--redis-url", hung.url, "web", "--bind", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/schedules"
        deadline = time.monotonic() + 30
        while True:  # serving
            try:
                urllib.request.urlopen(url, timeout=5).read()
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the web view did not start"
                time.sleep(0.2)
        freeze(hung)
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(url, timeout=60).read()
        assert answer.value.code == 503
        assert time.monotonic() - started < 10  # its 5 s, not 30
    finally:
        thaw(hung)
        web.terminate()
        web.wait(30)
