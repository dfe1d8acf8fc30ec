"""A backfill replays the past out of band, with a real prefork Celery worker and pump.

Three 1 s schedules, each backfilled over the 8 slots before it existed (rate 0: sent at
once), whose backfilled runs (the `emq_backfill` header) behave otherwise than live ones:

* `sk` (overlap skip): a backfilled run sleeps 4 s, longer than the gap, a live one 0.1 s.
  The backfilled runs are not in flight for the policy: no live slot is skipped behind them.
* `rp` (overlap replace), the same task: no live slot revokes a backfilled run, and no live
  occurrence is revoked on receipt because a backfilled one is in flight.
* `pf` (skip, `pause_after_failures=2`): a backfilled run fails, a live one succeeds. The
  backfilled failures neither count toward the pause nor move the live last status.

Every backfilled run is in the history, marked `backfill` (the worker's reports carry it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.outcome import HistoryEntry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOTS = 8  # backfilled per schedule
NAMES = ("sk", "rp", "pf")

APP = textwrap.dedent("""
    import os, time
    from celery import Celery
    from emq_bridge.celery.dispatch import header

    env = os.environ
    app = Celery("bfl", broker=env["BFL_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["BFL_BROKER"],
        emq_bridge_prefix=env["BFL_PREFIX"],
        emq_bridge_heartbeat_s=0.5,
        task_default_queue=env["BFL_QUEUE"],
        beat_max_loop_interval=0.5,
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
    )
    app.conf.beat_schedule = {
        "sk": {"task": "bfl.run", "schedule": 1.0, "overlap": "skip"},
        "rp": {"task": "bfl.run", "schedule": 1.0, "overlap": "replace"},
        "pf": {
            "task": "bfl.fail_past", "schedule": 1.0, "overlap": "skip",
            "pause_after_failures": 2,
        },
    }


    def past(request):
        return bool(header(request, "emq_backfill"))


    @app.task(bind=True, name="bfl.run")
    def run(self):
        time.sleep(4.0 if past(self.request) else 0.1)


    @app.task(bind=True, name="bfl.fail_past")
    def fail_past(self):
        if past(self.request):
            raise ValueError("a past slot fails")
""")


def wait_until(check: Callable[[], Any], timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return bool(check())


class Stack:
    def __init__(self, redis_url: str, tmp: Path) -> None:
        self.tmp = tmp
        self.prefix = f"t{uuid.uuid4().hex[:10]}"
        self.queue = f"{self.prefix}-q"
        self.env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(tmp), self.env.get("PYTHONPATH")])),
            BFL_BROKER=redis_url,
            BFL_PREFIX=self.prefix,
            BFL_QUEUE=self.queue,
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.backfilled: dict[str, list[int]] = {}  # name -> the slots its backfill queued
        self.before: dict[str, int] = {}  # process -> its log's length before the backfills
        self.repeat = Repeat(redis.Redis.from_url(redis_url), self.prefix)

    def start(self, name: str, argv: list[str]) -> None:
        with (self.tmp / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=self.tmp,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def history(self, name: str) -> list[HistoryEntry]:
        return self.repeat.history(self.queue, name, 200)

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGQUIT if name == "worker" else signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.repeat.close()


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("celery-backfill")
    (tmp / "bfl_app.py").write_text(APP)
    stack = Stack(redis_url, tmp)
    try:
        argv = [sys.executable, "-m", "celery", "-A", "bfl_app", "worker", "-P", "prefork"]
        argv += ["-c", "22", "-n", "bfl@%h", "-Q", stack.queue, "-l", "info"]
        stack.start("worker", [*argv, "--without-mingle", "--without-gossip"])
        stack.start("pump", [sys.executable, "-m", "emq_bridge", "pump", "--celery", "bfl_app"])
        assert wait_until(lambda: " ready." in stack.log("worker"), 90), stack.log("worker")
        assert wait_until(lambda: all(stack.repeat.get(stack.queue, n) for n in NAMES), 60), (
            stack.log("pump")
        )
        # The live schedules run a while first.
        assert wait_until(
            lambda: all(sum(e.status == "succeeded" for e in stack.history(n)) >= 2 for n in NAMES),
            30,
        ), stack.log("pump") + stack.log("worker")[-4000:]
        # What the worker and the pump logged before the backfills (a live `replace` slot
        # may revoke the live one before it while the fresh worker is slow to start it).
        stack.before = {n: len(stack.log(n)) for n in ("worker", "pump")}
        for name in NAMES:
            registration = stack.repeat.get(stack.queue, name)
            assert registration is not None and registration.created_ms is not None
            created = registration.created_ms
            done = stack.repeat.backfill(
                stack.queue, name, created - SLOTS * 1000 + 1, created - 1, rate=0
            )
            assert len(done.queued) == SLOTS, done
            stack.backfilled[name] = done.queued

        def ended() -> bool:
            for name in NAMES:
                entries = {e.due_ms: e for e in stack.history(name)}
                for slot in stack.backfilled[name]:
                    entry = entries.get(slot)
                    if entry is None or entry.status in ("running", "retrying"):
                        return False
            return True

        assert wait_until(ended, 60), stack.log("worker")[-6000:]
        time.sleep(1.5)  # a live slot or two after them
        yield stack
    finally:
        stack.stop()


def _window(stack: Stack, name: str) -> tuple[int, int]:
    """From the first backfilled run's start to the last one's end (worker's clock)."""
    slots = set(stack.backfilled[name])
    runs = [e for e in stack.history(name) if e.due_ms in slots and e.started_ms and e.finished_ms]
    assert runs
    return min(e.started_ms or 0 for e in runs), max(e.finished_ms or 0 for e in runs)


def test_every_backfilled_run_is_in_the_history_marked_backfill(stack: Stack) -> None:
    for name in NAMES:
        entries = {e.due_ms: e for e in stack.history(name)}
        slots = stack.backfilled[name]
        assert all(entries[slot].backfill for slot in slots), name
        expected = "failed" if name == "pf" else "succeeded"
        assert [entries[s].status for s in slots] == [expected] * SLOTS, (name, entries)
        assert not any(e.backfill for e in entries.values() if e.due_ms not in slots)


def test_live_slots_are_not_skipped_behind_backfilled_runs(stack: Stack) -> None:
    first, last = _window(stack, "sk")
    assert last - first >= 3500  # the backfilled runs slept 4 s
    live = [e for e in stack.history("sk") if first <= e.due_ms <= last]  # (all live)
    assert len(live) >= 3, live
    assert [e.status for e in live if e.status == "skipped"] == [], live
    ran = [e for e in live if e.status == "succeeded" and e.started_ms and e.started_ms < last]
    assert len(ran) >= 3, live  # live runs went on while backfilled ones ran


def test_replace_neither_revokes_backfilled_runs_nor_is_revoked_for_them(stack: Stack) -> None:
    entries = stack.history("rp")
    slots = set(stack.backfilled["rp"])
    assert [e for e in entries if e.due_ms in slots and e.status == "revoked"] == []
    first, last = _window(stack, "rp")
    live = [e for e in entries if first <= e.due_ms <= last]  # (all live)
    assert len(live) >= 3 and all(e.status == "succeeded" for e in live), live
    since = stack.before
    assert "revoked on receipt" not in stack.log("worker")[since["worker"] :]
    assert " replaces " not in stack.log("pump")[since["pump"] :]


def test_backfilled_failures_do_not_pause_the_live_schedule(stack: Stack) -> None:
    registration = stack.repeat.get(stack.queue, "pf")
    assert registration is not None
    assert not registration.paused, registration
    assert registration.failures == 0
    assert registration.last_status in ("succeeded", "running"), registration
    assert registration.last_error is None, registration
