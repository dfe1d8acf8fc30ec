"""`RegistryWatch` (resync.py): a process's declarations synced again when the registry lost
them, checked at the end of an outage and every `check_s` (a restart no pump saw)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from emq_bridge import Declaration, Repeat, define, sync
from emq_bridge.events import Tick
from emq_bridge.resync import RegistryWatch
from emq_bridge.sync import SyncPlan

SOURCE = "app"
QUEUE = "reports"


def declarations() -> list[Declaration]:
    return [
        Declaration(QUEUE, f"job-{i}", define(every="1m", template={"task": "t", "args": [i]}))
        for i in range(3)
    ]


def boot_sync(repeat: Repeat) -> list[SyncPlan]:
    return [sync(repeat, declarations(), SOURCE, stamp=True)]


def empty(repeat: Repeat) -> None:
    """What a registry restarted without persistence holds of the prefix: nothing."""
    keys = list(repeat.client.scan_iter(match=f"{repeat.prefix}:*", count=1000))
    if keys:
        repeat.client.delete(*keys)


def lost_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "the registry lost" in r.getMessage()]


def test_a_registry_emptied_without_an_outage_is_synced_again_at_the_next_check(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    boot_sync(repeat)
    watch = RegistryWatch(
        repeat, [QUEUE], [SOURCE], lambda: boot_sync(repeat), check_s=0.2, spread_s=0
    )
    watch.start()
    try:
        empty(repeat)
        deadline = time.monotonic() + 10
        while len(repeat.list(QUEUE)) < 3:
            assert time.monotonic() < deadline, "not synced again"
            watch.on_tick(Tick())  # the pump it listens to ticks: checks are made
            time.sleep(0.05)
        for _ in range(10):  # checks go on: nothing more is synced, nothing more logged
            watch.on_tick(Tick())
            time.sleep(0.05)
    finally:
        watch.stop()
    (line,) = lost_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        "emq-bridge: the registry lost 3 schedule(s) of app (Redis restarted empty, or "
        "evicted them: its maxmemory-policy must be noeviction): synced again"
    )


def test_a_watch_whose_pump_no_longer_ticks_checks_nothing(repeat: Repeat) -> None:
    boot_sync(repeat)
    synced: list[int] = []
    watch = RegistryWatch(
        repeat,
        [QUEUE],
        [SOURCE],
        lambda: synced.append(1) or boot_sync(repeat),
        check_s=0.05,
        spread_s=0,
    )
    watch.start()
    try:
        empty(repeat)  # the registry of a pump abandoned without `stop` (a test's, say)
        time.sleep(0.5)
    finally:
        watch.stop()
    assert synced == [] and repeat.list(QUEUE) == []


def test_the_end_of_an_outage_checks_at_once(repeat: Repeat) -> None:
    boot_sync(repeat)
    watch = RegistryWatch(repeat, [QUEUE], [SOURCE], lambda: boot_sync(repeat), spread_s=0)
    watch.start()  # its periodic check is a minute away
    try:
        watch.on_outage_begin(ConnectionError("gone"))
        empty(repeat)
        watch.on_outage_end(3.0)
        deadline = time.monotonic() + 10
        while len(repeat.list(QUEUE)) < 3:
            assert time.monotonic() < deadline, "not synced again"
            time.sleep(0.05)
    finally:
        watch.stop()


def test_schedules_cancelled_by_hand_are_not_a_loss(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    boot_sync(repeat)
    synced: list[int] = []
    watch = RegistryWatch(
        repeat, [QUEUE], [SOURCE], lambda: synced.append(1) or boot_sync(repeat), spread_s=0
    )
    watch.arm()
    for declaration in declarations():
        repeat.cancel(QUEUE, declaration.name)  # the queue's registry goes with the last one

    assert watch.check() is None
    assert synced == [] and repeat.list(QUEUE) == [] and not lost_lines(caplog)


def test_watches_racing_after_a_loss_put_each_schedule_back_once(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    boot_sync(repeat)
    watches = [
        RegistryWatch(repeat, [QUEUE], [SOURCE], lambda: boot_sync(repeat), spread_s=0)
        for _ in range(4)
    ]
    for watch in watches:
        watch.arm()
    empty(repeat)
    put_back: list[int | None] = []
    threads = [threading.Thread(target=lambda w=w: put_back.append(w.check())) for w in watches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sum(n or 0 for n in put_back) == 3
    assert sorted(r.name for r in repeat.list(QUEUE)) == ["job-0", "job-1", "job-2"]
    assert sum(int(r.getMessage().split()[4]) for r in lost_lines(caplog)) == 3
