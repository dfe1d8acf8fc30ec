"""Per-schedule log lines are bounded: a sync names the first few schedules it creates,
updates or removes, and a pump tick the first few registrations of each kind it tells (missed
slots, skipped slots, failed sends); the rest go to DEBUG, counted in one line.

Before, a Dramatiq worker's first boot on 2,000 new schedules logged 2,000 INFO lines (~220
KB) and then 2,000 missed-slot WARNINGs, into a pipe its parent does not read until every
worker process is ready: the worker blocked for Dramatiq's 30 s fork timeout
(`tests/dramatiq/test_dramatiq_boot_log_s24.py` boots a real one).
"""

from __future__ import annotations

import logging

import pytest

from emq_bridge import Declaration, Occurrence, Pump, Repeat, define, sync
from emq_bridge.definition import Overlap
from emq_bridge.errors import DispatchError
from emq_bridge.registry import OVERDUE_SHOWN
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
TEMPLATE = {"task": "reports.digest"}


def declared(count: int, every: str = "1h") -> list[Declaration]:
    return [
        Declaration("reports", f"job-{i:04d}", define(every=every, template=TEMPLATE))
        for i in range(count)
    ]


def messages(caplog: pytest.LogCaptureFixture, level: int, marker: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == level and marker in r.getMessage()
    ]


# -- sync -----------------------------------------------------------------------------------


def test_a_sync_creating_500_schedules_names_20_at_info_and_lists_all_at_debug(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="emq_bridge.sync"):
        plan = sync(repeat, declared(500), "app")
    assert len(plan.create) == 500

    named = messages(caplog, logging.INFO, "sync app: + ")
    assert named == [f"sync app: + reports/job-{i:04d}  every 1h" for i in range(20)]
    assert messages(caplog, logging.INFO, "more created") == [
        "sync app: 480 more created (listed at DEBUG)"
    ]
    listed = messages(caplog, logging.DEBUG, "sync app: + ")
    assert listed == [f"sync app: + reports/job-{i:04d}  every 1h" for i in range(20, 500)]
    assert "sync app: 500 created, 0 updated, 0 unchanged, 0 removed" in caplog.text


def test_a_sync_at_info_logs_a_bounded_number_of_lines_for_500_creations(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    # What a worker logs at its usual level: a few lines, not one per schedule.
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        sync(repeat, declared(500), "app")
    assert len([r for r in caplog.records if r.name == "emq_bridge.sync"]) == 20 + 2


def test_updates_and_removals_are_named_at_warning_up_to_50_each_the_rest_at_debug(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    sync(repeat, declared(140), "app")
    # 70 change their cadence, 70 are dropped.
    with caplog.at_level(logging.DEBUG, logger="emq_bridge.sync"):
        plan = sync(repeat, declared(70, every="2h"), "app")
    assert (len(plan.update), len(plan.remove)) == (70, 70)

    updated = messages(caplog, logging.WARNING, "sync app: ~ ")
    assert updated == [f"sync app: ~ reports/job-{i:04d}  every 1h -> every 2h" for i in range(50)]
    removed = messages(caplog, logging.WARNING, "sync app: - ")
    assert removed == [f"sync app: - reports/job-{i:04d}  (was every 1h)" for i in range(70, 120)]
    assert messages(caplog, logging.WARNING, "more") == [
        "sync app: 20 more updated (listed at DEBUG)",
        "sync app: 20 more removed (listed at DEBUG)",
    ]
    # The rest, said in full at DEBUG.
    assert messages(caplog, logging.DEBUG, "sync app: ~ ") == [
        f"sync app: ~ reports/job-{i:04d}  every 1h -> every 2h" for i in range(50, 70)
    ]
    assert messages(caplog, logging.DEBUG, "sync app: - ") == [
        f"sync app: - reports/job-{i:04d}  (was every 1h)" for i in range(120, 140)
    ]


# -- a pump tick ----------------------------------------------------------------------------


def register(repeat: Repeat, count: int, overlap: Overlap = "allow") -> None:
    for i in range(count):
        repeat.register(
            "reports", f"job-{i:04d}", every="1m", template=TEMPLATE, now_ms=T0, overlap=overlap
        )


MISSED = "missed, unclaimed in time"


def test_a_tick_in_which_300_registrations_miss_slots_warns_of_5_and_counts_the_rest(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    register(repeat, 300)
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    with caplog.at_level(logging.DEBUG, logger="emq_bridge.pump"):
        tick = pump.run_once(now_ms=T0 + 60 * 60_000 + 30_000)  # an hour down: 59 missed each
    assert len(tick.dispatched) == 300  # several batches, one tick

    warned = messages(caplog, logging.WARNING, MISSED)
    assert len(warned) == 5
    assert all(" 59 slot(s) missed, unclaimed in time (60 passed, " in line for line in warned)
    assert messages(caplog, logging.WARNING, "more registration(s)") == [
        "295 more registration(s) missed slots no pump claimed in time (17405 slot(s), counted in "
        "missed), in queue(s) reports (listed at DEBUG)"
    ]
    listed = messages(caplog, logging.DEBUG, MISSED)
    assert len(listed) == 295
    told = {line.split(":")[0] for line in warned + listed}
    assert told == {f"reports/job-{i:04d}" for i in range(300)}
    assert sum(r.missed for r in repeat.list("reports")) == 300 * 59


def test_each_tick_warns_of_its_own_first_few_and_a_quiet_tick_says_nothing(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    register(repeat, 12)
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    with caplog.at_level(logging.WARNING, logger="emq_bridge.pump"):
        pump.run_once(now_ms=T0 + 10 * 60_000)
        pump.run_once(now_ms=T0 + 10 * 60_000 + 1000)  # nothing due
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        pump.run_once(now_ms=T0 + 30 * 60_000)  # down again
        second = [r.getMessage() for r in caplog.records]
    for lines in (first, second):
        assert len([line for line in lines if MISSED in line]) == 5
        assert len([line for line in lines if line.startswith("7 more registration(s)")]) == 1
        assert len(lines) == 6, lines


def test_a_tick_skipping_the_slots_of_40_registrations_in_flight_names_5_at_info(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    register(repeat, 40, overlap="skip")
    pump = Pump(repeat, ["reports"], RecordingDispatcher())
    assert len(pump.run_once(now_ms=T0 + 60_000).dispatched) == 40  # in flight: no report
    with caplog.at_level(logging.DEBUG, logger="emq_bridge.pump"):
        assert pump.run_once(now_ms=T0 + 120_000).dispatched == []
    assert len(messages(caplog, logging.INFO, ":00.000+00:00 skipped: an occurrence")) == 5
    assert messages(caplog, logging.INFO, "more slot(s)") == [
        "35 more slot(s) skipped: an occurrence is in flight, in queue(s) reports (listed at DEBUG)"
    ]
    assert len(messages(caplog, logging.DEBUG, ":00.000+00:00 skipped: an occurrence")) == 35


class Down:
    """A dispatcher whose broker refuses every send."""

    def dispatch(self, occurrence: Occurrence) -> None:
        raise DispatchError("the broker is down")


def test_a_broker_refusing_a_tick_of_100_sends_logs_5_errors_and_one_count(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    register(repeat, 100)
    pump = Pump(repeat, ["reports"], Down())
    with caplog.at_level(logging.INFO, logger="emq_bridge.pump"):
        tick = pump.run_once(now_ms=T0 + 60_000)
    assert len(tick.failed) == 100
    failed = messages(caplog, logging.ERROR, "dispatch of occurrence")
    assert len(failed) == 5
    assert all(line.endswith("DispatchError: the broker is down") for line in failed)
    assert messages(caplog, logging.ERROR, "more dispatch(es)") == [
        "95 more dispatch(es) failed; each is retried after its lease, in queue(s) reports "
        "(listed at DEBUG)"
    ]


def test_a_deploy_changing_many_overdue_cadences_names_a_few_and_counts_the_rest(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    t0, minute = 1_900_000_000_000 - 1_900_000_000_000 % 3_600_000, 60_000
    before = define(every="10m", template={"task": "t"})
    after = define(every="1h", template={"task": "t"})
    repeat.upsert_many([("q", f"c{i:03d}", before) for i in range(60)], now_ms=t0)
    with caplog.at_level(logging.DEBUG, logger="emq_bridge.registry"):
        repeat.upsert_many([("q", f"c{i:03d}", after) for i in range(60)], now_ms=t0 + 35 * minute)
    told = [r for r in caplog.records if "while its next run was overdue" in r.getMessage()]
    warned = [r for r in told if r.levelno == logging.WARNING]
    assert sum("its cadence changed" in r.getMessage() for r in warned) == OVERDUE_SHOWN
    assert sum(r.levelno == logging.DEBUG for r in told) == 60 - OVERDUE_SHOWN
    [summary] = [r for r in caplog.records if "more cadence(s)" in r.getMessage()]
    assert summary.levelno == logging.WARNING
    assert summary.getMessage().startswith(f"{60 - OVERDUE_SHOWN} more cadence(s) changed")
    assert all(repeat.get("q", f"c{i:03d}").missed == 3 for i in range(60))  # type: ignore[union-attr]
