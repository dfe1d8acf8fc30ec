"""The misfire policy, catch-up window and `all`'s bound through every surface: the TOML
file, the CLI `add`, the Dramatiq decorators (declared, then fired by a real worker), and
`show`. The Celery surfaces are in tests/celery/test_celery_misfire.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from click.testing import CliRunner, Result
from dramatiq.brokers.stub import StubBroker

from emq_bridge import ConfigError, Repeat, ScheduleError
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file, sync_file
from emq_bridge.dramatiq import (
    DramatiqDispatcher,
    RecurringMiddleware,
    broker_declarations,
    cron,
    current_occurrence,
    every,
    recurring,
    register,
)
from emq_bridge.testing import ManualClock, manual_pump

MIN = 60_000
HOUR_MS = 60 * MIN
T0 = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
Run = Callable[..., Result]


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args], **kwargs)

    return invoke


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "schedules.toml"
    path.write_text('queue = "reports"\n' + text)
    return path


def test_the_toml_file_takes_every_policy_a_window_and_a_bound(tmp_path: Path) -> None:
    text = """
[[schedule]]
name = "etl"
task = "t"
every = "1h"
misfire = "all"
catchup_window = "1d"
catchup_max = 24
[[schedule]]
name = "report"
task = "t"
cron = "0 6 * * *"
misfire = "earliest"
catchup_window = 7200
[[schedule]]
name = "old"
task = "t"
every = "1h"
misfire = "coalesce"
"""
    etl, report, old = load_schedule_file(write(tmp_path, text)).declarations
    assert (etl.definition.misfire, etl.definition.catchup_window_ms) == ("all", 86_400_000)
    assert etl.definition.catchup_max == 24
    assert (report.definition.misfire, report.definition.catchup_window_ms) == (
        "earliest",
        7_200_000,
    )
    assert (old.definition.misfire, old.definition.catchup_window_ms) == ("coalesce", None)


@pytest.mark.parametrize(
    ("lines", "field", "reason"),
    [
        ('misfire = "oldest"', "misfire", "must be one of latest, earliest, skip, all"),
        ('catchup_window = "soon"', "catchup_window", "is not an interval"),
        ("catchup_window = true", "catchup_window", "must be seconds or a string"),
        ("catchup_max = 5", "catchup_max", "applies to misfire='all' only"),
        ('misfire = "all"\ncatchup_max = 0', "catchup_max", "from 1 to 10000"),
    ],
)
def test_a_bad_misfire_field_in_the_file_names_the_field(
    tmp_path: Path, lines: str, field: str, reason: str
) -> None:
    text = f'[[schedule]]\nname = "a"\ntask = "t"\nevery = "1h"\n{lines}\n'
    with pytest.raises(ConfigError, match=field) as caught:
        load_schedule_file(write(tmp_path, text))
    assert reason in str(caught.value)


def test_the_cli_adds_a_windowed_all_and_show_says_it(run: Run, repeat: Repeat) -> None:
    result = run(
        "add", "reports", "etl", "--task", "t", "--every", "1h", "--misfire", "all",
        "--catchup-window", "6h", "--catchup-max", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    registration = repeat.get("reports", "etl")
    assert registration is not None
    assert registration.definition.catchup_window_ms == 6 * 60 * MIN
    assert registration.definition.catchup_max == 3
    show = run("show", "reports", "etl").output
    assert "misfire   all, window 6 h 0 min, at most 3 per catch-up" in show
    run("add", "reports", "old", "--task", "t", "--every", "1h", "--misfire", "coalesce")
    assert "misfire   coalesce (= latest), window none" in run("show", "reports", "old").output


def test_the_cli_refuses_a_bad_window_with_exit_1_and_writes_nothing(
    run: Run, repeat: Repeat
) -> None:
    result = run("add", "reports", "x", "--task", "t", "--every", "1h", "--catchup-window", "0")
    assert result.exit_code == 1 and "catchup_window" in result.output
    assert repeat.names("reports") == []
    result = run("add", "reports", "x", "--task", "t", "--every", "1h", "--catchup-max", "0")
    assert result.exit_code == 2  # click's range check: a usage error
    assert repeat.names("reports") == []


def test_the_dramatiq_decorators_declare_the_policies(prefix: str) -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(prefix=prefix))

    @recurring(every="1h", name="etl", misfire="all", catchup_window="1d", catchup_max=24)
    @dramatiq.actor(broker=broker, queue_name="reports")
    def etl() -> None: ...

    @dramatiq.actor(
        broker=broker,
        queue_name="reports",
        recurring=[
            every("15m", misfire="skip"),
            cron("0 6 * * *", name="daily", misfire="earliest", catchup_window=3600),
        ],
    )
    def digest() -> None: ...

    declared = {d.name: d.definition for d in broker_declarations(broker)}
    assert (declared["etl"].misfire, declared["etl"].catchup_max) == ("all", 24)
    assert declared["etl"].catchup_window_ms == 86_400_000
    assert declared["digest"].misfire == "skip"
    assert (declared["daily"].misfire, declared["daily"].catchup_window_ms) == (
        "earliest",
        3_600_000,
    )
    with pytest.raises(ScheduleError, match="catchup_max applies to misfire='all' only"):
        recurring(every="1h", catchup_max=3)


def test_a_dramatiq_worker_runs_the_newest_missed_slot_once_by_default(repeat: Repeat) -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False))
    runs: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="reports")
    def report() -> None:
        info = current_occurrence()
        assert info is not None
        runs.append(info.due_ms)

    clock = ManualClock(T0)
    register(repeat, report, every="1h", now_ms=clock())
    pump = manual_pump(repeat, ["reports"], clock, DramatiqDispatcher(broker))
    clock.advance(timedelta(days=3, minutes=5))  # 72 hourly slots passed
    pump.run_once()
    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()
    try:
        broker.join("reports", fail_fast=True)
    finally:
        worker.stop()
    assert runs == [T0 + 72 * 60 * MIN]  # the report of the last hour, not of three days ago
    registration = repeat.get("reports", "report")
    assert registration is not None and registration.missed == 71


def test_a_sync_that_changes_the_window_says_so_and_keeps_the_next_run(
    tmp_path: Path, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    entry = '[[schedule]]\nname = "etl"\ntask = "t"\nevery = "1h"\nmisfire = "all"\n'
    sync_file(repeat, write(tmp_path, entry + 'catchup_window = "10m"\n'))
    before = repeat.get("reports", "etl")
    with caplog.at_level(logging.WARNING, logger="emq_bridge.sync"):
        sync_file(repeat, write(tmp_path, entry + 'catchup_window = "1h"\ncatchup_max = 5\n'))
    [line] = [r.getMessage() for r in caplog.records if "reports/etl" in r.getMessage()]
    assert "catchup_window 600000 -> 3600000" in line and "catchup_max - -> 5" in line
    after = repeat.get("reports", "etl")
    assert before is not None and after is not None
    assert after.next_run_ms == before.next_run_ms  # not a cadence change
    assert (after.definition.catchup_window_ms, after.definition.catchup_max) == (HOUR_MS, 5)
