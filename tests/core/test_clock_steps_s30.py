"""A worker's or a pump's wall clock stepped (NTP) or off: what the registry is told stays
measured on one clock (probe: clocks).

* A run's duration: the end of a run whose start the same process stamped is that start
  plus the time elapsed on the monotonic clock (docs/lifecycle.md), in `Repeat.started` /
  `finished`, Dramatiq's `MessageOutcomes` and Celery's signal receivers. Before, both ends
  were `time.time()`: a clock stepped 1 h ahead during a run made its duration 1 h (and
  `show` said it finished "in 59 min"), stepped back 1 h made it 0 ms.
* A pump's start (`PumpInfo.started_ms`, `emq-bridge pumps`): on the server's clock, as every
  time of its heartbeat. Before, it was the pump host's `time.time()`: a host 90 s ahead
  showed a pump STARTED "in 1 min".

In process, on the test server; the wall clock is `time.time` shifted (`SteppedClock`),
`time.monotonic` left alone, as on a host whose clock is stepped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from dramatiq import Message
from dramatiq.broker import MessageProxy

from emq_bridge import Occurrence, Pump, Repeat, occurrence_id
from emq_bridge.celery import reporter_for
from emq_bridge.celery.dispatch import occurrence_headers
from emq_bridge.dramatiq.outcomes import MessageOutcomes
from emq_bridge.dramatiq.schedule import OPTION_DUE_MS, OPTION_NAME, OPTION_QUEUE
from emq_bridge.heartbeat import Heartbeat
from emq_bridge.outcome import HistoryEntry
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

HOUR_S = 3600.0
RUN_S = 0.3
# What a 0.3 s run may be reported as on a loaded machine: far from the step either way.
SHORTEST_MS, LONGEST_MS = 250, 3_000


class SteppedClock:
    """`time.time` (and so every wall-clock stamp of this process) `offset_s` off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset_s = 0.0
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + self.offset_s)

    def step(self, seconds: float) -> None:
        self.offset_s += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SteppedClock:
    return SteppedClock(monkeypatch)


def _registered(repeat: Repeat, name: str) -> int:
    """Register `name` in queue `q` (hourly, nothing due soon); return a due time of it."""
    now = repeat.server_time_ms()
    repeat.upsert("q", name, every="1h", template={"task": "t"}, now_ms=now - 60_000)
    return now - 1_000


def _only_entry(repeat: Repeat, queue: str, name: str) -> HistoryEntry:
    (entry,) = repeat.history(queue, name)
    assert entry.status == "succeeded", entry
    return entry


def _assert_measured(repeat: Repeat, queue: str, name: str) -> None:
    """The run of `name` lasted `RUN_S` for the registry, and its end follows its start."""
    entry = _only_entry(repeat, queue, name)
    assert entry.duration_ms is not None
    assert SHORTEST_MS <= entry.duration_ms <= LONGEST_MS, entry
    record = repeat.get(queue, name)
    assert record is not None and record.last_success_ms == entry.finished_ms
    assert record.last_duration_ms == entry.duration_ms


STEPS = pytest.mark.parametrize("step_s", [HOUR_S, -HOUR_S], ids=["ahead", "back"])


@STEPS
def test_repeat_finished_times_the_run_from_its_start_on_the_monotonic_clock(
    repeat: Repeat, clock: SteppedClock, step_s: float
) -> None:
    due = _registered(repeat, "a")
    message = {"id": f"a-{uuid.uuid4().hex}", "queue": "q", "name": "a", "due_ms": due}
    assert repeat.started(message)
    clock.step(step_s)
    time.sleep(RUN_S)
    assert repeat.finished(message, ok=True)
    _assert_measured(repeat, "q", "a")


def test_repeat_finished_without_its_start_here_is_the_wall_clock(
    repeat: Repeat, clock: SteppedClock
) -> None:
    """A run whose start another process reported: its end is this host's clock, as before."""
    due = _registered(repeat, "a")
    message = {"id": f"a-{uuid.uuid4().hex}", "queue": "q", "name": "a", "due_ms": due}
    clock.step(60.0)
    before_ms = int(time.time() * 1000)
    assert repeat.finished(message, ok=True)
    entry = repeat.history("q", "a")[0]
    assert entry.finished_ms is not None and entry.finished_ms >= before_ms


@STEPS
def test_dramatiq_outcomes_time_the_run_from_its_start_on_the_monotonic_clock(
    repeat: Repeat, clock: SteppedClock, step_s: float
) -> None:
    due = _registered(repeat, "a")
    options = {OPTION_DUE_MS: due, OPTION_NAME: "a", OPTION_QUEUE: "q"}
    ident = occurrence_id(repeat.prefix, "q", "a", due)  # as the pump sends it
    message = MessageProxy(
        Message(
            queue_name="q", actor_name="a", args=(), kwargs={}, options=options, message_id=ident
        )
    )
    reporter = Reporter(repeat, linger_s=0.0)
    outcomes = MessageOutcomes(lambda: reporter)
    try:
        assert outcomes.started(message) == "run"
        clock.step(step_s)
        time.sleep(RUN_S)
        outcomes.processed(message, None)
        outcomes.acked(message)
        assert reporter.flush(5.0)
    finally:
        reporter.close()
    _assert_measured(repeat, "q", "a")


@pytest.fixture
def celery_app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"clock-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{prefix}-q",
        emq_bridge_prefix=prefix,
        emq_bridge_redis_url=redis_url,
        result_backend=None,
    )
    yield app
    app.close()


@STEPS
def test_celery_receivers_time_the_run_from_its_start_on_the_monotonic_clock(
    celery_app: Celery, repeat: Repeat, prefix: str, clock: SteppedClock, step_s: float
) -> None:
    queue = f"{prefix}-q"
    repeat.register(queue, "stepped", every="1h", template={"task": "clock.stepped"})

    @celery_app.task(name="clock.stepped", shared=False)
    def stepped() -> None:
        clock.step(step_s)  # NTP steps the worker's clock while its task runs
        time.sleep(RUN_S)

    due = repeat.server_time_ms() - 1_000
    occurrence = Occurrence(
        queue=queue,
        name="stepped",
        due_ms=due,
        id=occurrence_id(prefix, queue, "stepped", due),
        template={"task": "clock.stepped"},
        released_ms=repeat.server_time_ms(),  # after the registration was made, as a pump's
    )
    stepped.apply(task_id=occurrence.id, headers=occurrence_headers(occurrence))
    reporter = reporter_for(celery_app)
    assert reporter is not None and reporter.flush(10)
    _assert_measured(repeat, queue, "stepped")


def _pump_started(repeat: Repeat, start: Callable[[], Any]) -> int:
    """The `started_ms` of the one pump `start` makes live, as `emq-bridge pumps` reads it."""
    start()
    (info,) = repeat.pumps(["q"])
    return info.started_ms


def test_a_pump_whose_host_is_ahead_started_on_the_servers_clock(
    client: redis.Redis, prefix: str, clock: SteppedClock
) -> None:
    repeat = Repeat(client, prefix)
    _registered(repeat, "a")
    clock.step(90.0)  # the pump's host is 90 s ahead of the server
    before_ms = repeat.server_time_ms()
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    time.sleep(0.2)
    started_ms = _pump_started(repeat, pump.step)
    after_ms = repeat.server_time_ms()
    # Made between the two reads of the server's clock (ms cut, a tick's lag: 50 ms slack).
    assert before_ms - 50 <= started_ms <= after_ms, (before_ms, started_ms, after_ms)
    pump.heartbeat.remove(repeat)


def test_a_heartbeat_written_before_any_tick_started_on_the_servers_clock(
    repeat: Repeat, clock: SteppedClock
) -> None:
    _registered(repeat, "a")
    clock.step(-90.0)  # this host is behind: the start must not read 90 s old either
    before_ms = repeat.server_time_ms()
    heartbeat = Heartbeat(["q"], max_sleep_s=1.0)
    started_ms = _pump_started(repeat, lambda: heartbeat.write(repeat))
    assert before_ms - 50 <= started_ms <= repeat.server_time_ms()
    heartbeat.remove(repeat)
