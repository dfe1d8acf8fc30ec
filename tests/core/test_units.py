"""A bare number for an interval means seconds, as in Celery, APScheduler and periodiq;
`every_ms` keeps milliseconds (EchoMQ's field). The same everywhere an interval is taken."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from emq_bridge import Every, Repeat, ScheduleError, define
from emq_bridge.cadence import parse_every
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file
from emq_bridge.testing import ManualClock

T0 = 1_900_000_000_000


@pytest.mark.parametrize(
    ("given", "every_ms"),
    [(90, 90_000), (1.5, 1_500), ("90", 90_000), ("2.25", 2_250), ("90s", 90_000),
     ("500ms", 500), (timedelta(minutes=2), 120_000), (0.001, 1), (1.001, 1001),
     (timedelta(seconds=1.001), 1001)],
)  # fmt: skip
def test_every_reads_numbers_as_seconds(given: float | str | timedelta, every_ms: int) -> None:
    assert parse_every(given) == every_ms
    assert define(every=given).cadence == Every(every_ms)


def test_every_ms_keeps_milliseconds() -> None:
    assert define(every_ms=90).cadence == Every(90)


@pytest.mark.parametrize("given", [0, -1, 0.0004, float("nan"), float("inf"), True, "1e3"])
def test_what_is_not_a_positive_interval_is_refused(given: object) -> None:
    with pytest.raises(ScheduleError):
        parse_every(given)  # type: ignore[arg-type]


def test_the_api_the_file_and_the_cli_agree_on_seconds(
    tmp_path: Path, repeat: Repeat, redis_url: str
) -> None:
    repeat.register("q", "api", every=90, template={"task": "t"}, now_ms=T0)
    path = tmp_path / "s.toml"
    path.write_text('[[schedule]]\nqueue = "q"\nname = "file"\ntask = "t"\nevery = 90\n')
    [declaration] = load_schedule_file(path).declarations
    result = CliRunner().invoke(
        cli,
        ["--redis-url", redis_url, "--prefix", repeat.prefix, "add", "q", "cli", "--task", "t",
         "--every", "90"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    api, cli_added = repeat.get("q", "api"), repeat.get("q", "cli")
    assert api is not None and cli_added is not None
    assert api.definition.cadence == declaration.definition.cadence == Every(90_000)
    assert cli_added.definition.cadence == Every(90_000)


def test_both_decorators_read_seconds() -> None:
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.stub import StubBroker

    from emq_bridge.celery import app_schedule
    from emq_bridge.celery import recurring as celery_recurring
    from emq_bridge.dramatiq import RecurringMiddleware, broker_declarations, recurring

    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(run_pump=False))

    @recurring(every=90)
    @dramatiq.actor(broker=broker, queue_name="q")
    def tick() -> None: ...

    app = Celery("units", broker="memory://")

    @celery_recurring(every=90)
    @app.task(name="units.tock")  # type: ignore[untyped-decorator]
    def tock() -> None: ...

    [dramatiq_one] = broker_declarations(broker)
    [celery_one] = [d for d in app_schedule(app).declarations if d.name == "units.tock"]
    assert dramatiq_one.definition.cadence == celery_one.definition.cadence == Every(90_000)


def test_the_manual_clock_moves_by_the_exact_ms_of_a_timedelta_or_a_datetime() -> None:
    # Through a float, 1.001 s is 1000.9999999999999 ms, and int() made it 1000.
    at = datetime(2030, 1, 1, 0, 0, 0, 1000, tzinfo=timezone.utc)
    clock = ManualClock(at)
    assert clock.now_ms == 1_893_456_000_001
    assert clock.advance(timedelta(seconds=1.001)) == 1_893_456_001_002
    assert clock.set(at + timedelta(milliseconds=3)) == 1_893_456_000_004
