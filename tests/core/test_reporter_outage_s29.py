"""Reports wait while Redis is unreachable (`Reporter`), found by a chaos soak.

Before, a batch that met an outage was dropped. A guarded occurrence whose overlap check
failed in an outage of a few seconds ran unguarded, and its start and final reports were
dropped, so the registry kept it in flight and its `skip` schedule skipped every slot for
the start timeout (10 minutes). Now the thread keeps the batch at the front of its queue and
sends it once Redis answers again, backing off meanwhile: the reports reach the registry in
the order they were queued. `max_pending` still bounds what waits (the newest past it are
dropped and counted), and a flush or a close during the outage drops what is left at once,
as before. Real reporter thread, a real server stopped and started again with its data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.events import OutcomeEvents, add_outcome_listener, remove_outcome_listener
from emq_bridge.lifecycle import report_of
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter

TEMPLATE = {"task": "reports.digest"}
WAIT_LINE = "occurrence reports wait until Redis takes them again"
DROP_LINE = "occurrence reports are dropped until Redis takes them again"
BACK_LINE = "occurrence reports reach Redis again"


class Sent(Repeat):
    """The registry, keeping every `report` call the reporter makes and whether it went
    through, and counting the probes (`server_time_ms`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[Report], bool]] = []
        self.probes = 0

    def report(self, reports: Sequence[Report], **options: Any) -> int:
        try:
            applied = super().report(reports, **options)
        except Exception:
            self.calls.append((list(reports), False))
            raise
        self.calls.append((list(reports), True))
        return applied

    def server_time_ms(self) -> int:
        self.probes += 1
        return super().server_time_ms()

    def applied(self) -> list[Report]:
        """The reports of the calls that went through, in order, heartbeats left out."""
        return [r for batch, ok in self.calls if ok for r in batch if r.kind != "heartbeat"]

    def failed_calls(self) -> int:
        return sum(1 for _, ok in self.calls if not ok)


class Heard(OutcomeEvents):
    """An outcome listener (what the metrics are): every report it heard of, heartbeats left
    out."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def on_reports(self, reports: Sequence[Report]) -> None:
        self.reports += [r for r in reports if r.kind != "heartbeat"]


@pytest.fixture
def heard() -> Iterator[Heard]:
    listener = Heard()
    add_outcome_listener(listener)
    yield listener
    remove_outcome_listener(listener)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test's own whose data survives a SIGKILL (AOF, fsync always)."""
    made = EmbeddedServer(
        directory=str(tmp_path), extra_args=["--appendonly", "yes", "--appendfsync", "always"]
    ).start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def repeat(server: EmbeddedServer) -> Iterator[Sent]:
    client = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    made = Sent(client, "s29")
    now = made.server_time_ms()
    for name in ("job", "long"):
        made.upsert("q", name, every="1h", template=TEMPLATE, now_ms=now - 60_000)
    yield made
    made.close()


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Callable[[str], list[str]]:
    caplog.set_level(logging.INFO, logger="emq_bridge.reporting")

    def having(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    return having


def wait_until(check: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.02)


def _occurrence(due_ms: int, name: str = "job") -> dict[str, Any]:
    return {"id": f"{name}-{due_ms}", "queue": "q", "name": name, "due_ms": due_ms}


def _finals(now: int, n: int) -> list[Report]:
    """The final reports of `n` occurrences of `job`, oldest slot first."""
    kinds = ("succeeded", "failed")
    return [
        report_of(kinds[i % 2], _occurrence(now - (n - i) * 3_600_000), at_ms=now + i)
        for i in range(n)
    ]


def _statuses(repeat: Repeat) -> dict[str, str]:
    return {e.id: e.status for e in repeat.history("q", "job", 50)}


def test_reports_queued_during_an_outage_reach_the_registry_after_it_in_order(
    server: EmbeddedServer, repeat: Sent, lines: Callable[[str], list[str]], heard: Heard
) -> None:
    now = repeat.server_time_ms()
    reporter = Reporter(repeat, heartbeat_s=0.3)
    long_run = report_of("started", _occurrence(now, "long"))
    reporter.report(long_run)  # runs through the outage, heartbeated
    wait_until(repeat.applied, 5, "the long run's start")

    server.kill()
    finals = _finals(now, 6)
    for item in finals:
        reporter.report(item)  # never raises, never waits
    wait_until(lambda: lines(WAIT_LINE), 5, "the reports waiting")
    time.sleep(1.2)  # the heartbeats fall due 4 times; the retries back off
    assert repeat.failed_calls() == 1  # a retry asks Redis first: it is down
    assert repeat.probes <= 3  # 0.5 s, then 1 s: no spinning
    server.start()

    expected = {item.id: item.kind for item in finals}
    wait_until(lambda: _statuses(repeat) == expected, 10, "the kept reports in the history")
    # The reporter's thread notes its call once `report` returns, just after the server
    # applied it (what the history read above can see first).
    wait_until(lambda: len(repeat.applied()) > 1, 5, "the kept reports' call noted")
    assert repeat.applied() == [long_run, *finals]  # in the order they were queued
    assert repeat.failed_calls() == 1
    # The heartbeats due during the outage waited as one round at most, not one a beat.
    failed_at = next(i for i, (_, ok) in enumerate(repeat.calls) if not ok)
    first_back = repeat.calls[failed_at + 1][0]
    assert sum(r.kind == "heartbeat" for r in first_back) <= 1, first_back
    assert repeat.history("q", "long")[0].status == "running"
    # The metrics count each report once: at the call that failed, not again when sent.
    assert heard.reports == [long_run, *finals]

    (waited,) = lines(WAIT_LINE)
    assert "Redis is unreachable" in waited and "the tasks are not affected" in waited
    (back,) = lines(BACK_LINE)
    assert back.startswith(f"{BACK_LINE}; "), back
    assert "were dropped" in back and ", 0 were dropped" in back, back
    assert lines(DROP_LINE) == []
    reporter.close()


def test_past_max_pending_the_newest_reports_are_dropped_and_counted(
    server: EmbeddedServer, repeat: Sent, lines: Callable[[str], list[str]]
) -> None:
    now = repeat.server_time_ms()
    reporter = Reporter(repeat, max_pending=3)
    finals = _finals(now, 5)

    server.kill()
    for item in finals[:3]:
        reporter.report(item)
    wait_until(lambda: lines(WAIT_LINE), 5, "the reports waiting")
    for item in finals[3:]:
        reporter.report(item)  # the queue holds 3: these are dropped
    wait_until(lambda: lines(DROP_LINE), 5, "the drop")
    (dropped,) = lines(DROP_LINE)
    assert "the report queue is full" in dropped
    server.start()

    wait_until(lambda: lines(BACK_LINE), 10, "the reports going through again")
    assert reporter.flush(5)
    assert _statuses(repeat) == {item.id: item.kind for item in finals[:3]}
    assert repeat.applied() == finals[:3]
    assert lines(BACK_LINE) == [f"{BACK_LINE}; 3 kept meanwhile are sent, 2 were dropped"]
    reporter.close()


def test_a_flush_or_a_close_during_an_outage_drops_what_waits_at_once(
    server: EmbeddedServer, repeat: Sent, lines: Callable[[str], list[str]]
) -> None:
    """A worker stopping while Redis is down waits no longer than it did: the backoff
    (2 s by then) is cut short and the reports are dropped, one line saying so."""
    now = repeat.server_time_ms()
    reporter = Reporter(repeat)
    server.kill()
    for item in _finals(now, 4):
        reporter.report(item)
    wait_until(lambda: lines(WAIT_LINE), 5, "the reports waiting")
    time.sleep(2.0)  # retries after 0.5 s and 1 s; now in a 2 s backoff

    started = time.monotonic()
    assert reporter.flush(3)
    reporter.close(3)
    assert time.monotonic() - started < 1.5
    (dropped,) = lines(DROP_LINE)
    assert "Redis is unreachable" in dropped
    assert lines(BACK_LINE) == []
