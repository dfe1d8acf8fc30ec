"""The occurrence lifecycle with real Celery: prefork workers report, real pumps decide.

One module-wide fleet runs every scenario at once, so the file waits once:

* main stack: a prefork worker and three racing `emq-bridge pump --celery` processes (one
  of them `--pipelined`): triggered runs that succeed, fail, retry then succeed, and kill
  their own pool process; a 1 s `skip` schedule whose task sleeps 2.5 s; a 1 s schedule
  that always fails with `pause_after_failures=3`; a 2 s `replace` schedule whose task
  sleeps until it is revoked;
* lost stack: a prefork worker SIGKILLed (with its pool) while it runs a `skip` schedule's
  task, then a second worker that serves the schedule's next slots;
* outage stack: a worker whose registry (a dedicated server) is stopped while its task runs.

The tasks note what they saw in a Redis list on the broker's server (never the registry's),
so the notes survive the registry's outage; the assertions read those notes, the registry's
history and the processes' logs.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from quiet import quiet_offset

from emq_bridge import Registration, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.outcome import HistoryEntry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HEARTBEAT_S = 0.5
# The pumps' longest sleep (`beat_max_loop_interval`): a lost occurrence is marked at a scan.
PUMP_SLEEP_S = 0.5
# How long after its last heartbeat an occurrence is marked lost, at most (docs/celery.md).
LOST_BOUND_S = 3 * HEARTBEAT_S + PUMP_SLEEP_S

APP = textwrap.dedent("""
    import json, os, signal, time
    import redis
    from celery import Celery
    from emq_bridge.celery import (
        last_success_time, nominal_due_ms, previous_nominal_time, recurring,
    )

    env = os.environ
    app = Celery("emql", broker=env["EMQL_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["EMQL_REGISTRY"],
        emq_bridge_prefix=env["EMQL_PREFIX"],
        emq_bridge_heartbeat_s=float(env["EMQL_HEARTBEAT_S"]),
        task_default_queue=env["EMQL_QUEUE"],
        beat_max_loop_interval=float(env["EMQL_PUMP_SLEEP_S"]),
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=True,
    )
    HOUR = 3600.0
    QUIET = env["EMQL_OFFSET"]  # the hourly entries' next slot far from now: only triggers run
    SCHEDULES = {
        "main": {
            "ok": {"task": "emql.ok", "schedule": HOUR, "offset": QUIET},
            "fail": {"task": "emql.fail", "schedule": HOUR, "offset": QUIET},
            "flaky": {"task": "emql.flaky", "schedule": HOUR, "offset": QUIET},
            "selfkill": {"task": "emql.selfkill", "schedule": HOUR, "offset": QUIET},
            "hardlimit": {"task": "emql.hardlimit", "schedule": HOUR, "offset": QUIET},
            "slow": {"task": "emql.slow", "schedule": 1.0, "overlap": "skip"},
            "flop": {
                "task": "emql.fail", "schedule": 1.0, "overlap": "skip",
                "pause_after_failures": 3,
            },
        },
        "lost": {"hang": {"task": "emql.hang", "schedule": 1.0, "overlap": "skip"}},
        "outage": {"outage": {"task": "emql.outage", "schedule": HOUR, "offset": QUIET}},
    }
    STACK = env["EMQL_STACK"]
    app.conf.beat_schedule = SCHEDULES[STACK]
    side = redis.Redis.from_url(env["EMQL_BROKER"])
    NOTES = env["EMQL_PREFIX"] + ":notes"


    def ms(when):
        return None if when is None else round(when.timestamp() * 1000)


    def note(task, what, **extra):
        request = task.request
        side.rpush(NOTES, json.dumps({
            "task": task.name, "what": what, "id": request.id,
            "due": nominal_due_ms(request), "retries": request.retries, "pid": os.getpid(),
            "previous": ms(previous_nominal_time(request)),
            "last_success": ms(last_success_time(request)),
            **extra,
        }))


    @app.task(bind=True, name="emql.ok")
    def ok(self):
        note(self, "ran")
        return "ok"


    @app.task(bind=True, name="emql.fail")
    def fail(self):
        note(self, "ran")
        raise ValueError("it always fails")


    @app.task(bind=True, name="emql.flaky")
    def flaky(self):
        note(self, "ran")
        if self.request.retries == 0:
            raise self.retry(countdown=0.5)
        return "second time lucky"


    @app.task(bind=True, name="emql.selfkill")
    def selfkill(self):
        note(self, "ran")
        # What this pool process reported for earlier tasks is sent first: a process killed
        # loses the reports still gathering (up to the reporter's linger, 50 ms), and this
        # test is about the killed task's own outcome, which the main process reports.
        from emq_bridge.celery.reporting import reporter_for

        reporter = reporter_for(self.app)
        if reporter is not None:
            reporter.flush(2)
        os.kill(os.getpid(), signal.SIGKILL)


    @app.task(bind=True, name="emql.hardlimit", time_limit=1)
    def hardlimit(self):
        note(self, "ran")
        time.sleep(30)  # killed by its hard time limit first


    @app.task(bind=True, name="emql.slow")
    def slow(self):
        note(self, "start")
        time.sleep(2.5)
        note(self, "end")


    if STACK == "main":
        @recurring(every=2, overlap="replace", name="replaced")
        @app.task(bind=True, name="emql.replaced")
        def replaced(self):
            note(self, "start")
            time.sleep(60)


    @app.task(bind=True, name="emql.hang")
    def hang(self):
        note(self, "start")
        if not side.exists(env["EMQL_PREFIX"] + ":killed"):
            time.sleep(60)
        note(self, "end")


    @app.task(bind=True, name="emql.outage")
    def outage(self):
        note(self, "start")
        deadline = time.monotonic() + 30
        while not side.exists(env["EMQL_PREFIX"] + ":down") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(4 * float(env["EMQL_HEARTBEAT_S"]))  # heartbeats fail meanwhile
        note(self, "end")
        return "done without its registry"
""")


@dataclass
class Stack:
    """Processes sharing an app configuration: a prefix, a queue, a registry."""

    key: str
    prefix: str
    queue: str
    registry_url: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


@dataclass
class Fleet:
    broker_url: str
    tmp: Path
    stacks: dict[str, Stack] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    marks: dict[str, Any] = field(default_factory=dict)
    # One grid offset for every process: a top of the hour mid-run would fire the hourly
    # entries once more (a second failure of `fail`, a second run of `outage`).
    offset: str = field(default_factory=quiet_offset)

    def stack(self, key: str, registry_url: str) -> Stack:
        prefix = f"t{uuid.uuid4().hex[:10]}"
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # the app's registry
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.tmp), env.get("PYTHONPATH")])),
            EMQL_BROKER=self.broker_url,
            EMQL_REGISTRY=registry_url,
            EMQL_PREFIX=prefix,
            EMQL_QUEUE=f"{prefix}-q",
            EMQL_STACK=key,
            EMQL_HEARTBEAT_S=str(HEARTBEAT_S),
            EMQL_PUMP_SLEEP_S=str(PUMP_SLEEP_S),
            EMQL_OFFSET=self.offset,
        )
        self.stacks[key] = Stack(key, prefix, f"{prefix}-q", registry_url, env)
        return self.stacks[key]

    def start(self, stack: Stack, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.tmp,
                env=stack.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own: SIGKILL takes its pool
            )
        stack.procs[name] = proc
        return proc

    def worker(self, stack: Stack, name: str, concurrency: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "celery", "-A", "emql_app", "worker", "-P", "prefork"]
        argv += ["-c", str(concurrency), "-n", f"{name}@%h", "-Q", stack.queue, "-l", "info"]
        argv += ["--without-mingle", "--without-gossip"]
        return self.start(stack, name, argv)

    def pump(self, stack: Stack, name: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "emq_bridge", "pump", "--celery", "emql_app", *extra]
        return self.start(stack, name, argv)

    def repeat(self, key: str) -> Repeat:
        stack = self.stacks[key]
        return Repeat(redis.Redis.from_url(stack.registry_url), stack.prefix)

    def notes(self, key: str) -> list[dict[str, Any]]:
        with redis.Redis.from_url(self.broker_url) as client:
            raw = client.lrange(f"{self.stacks[key].prefix}:notes", 0, -1)
        return [json.loads(item) for item in raw]

    def flag(self, key: str, name: str) -> None:
        with redis.Redis.from_url(self.broker_url) as client:
            client.set(f"{self.stacks[key].prefix}:{name}", 1)

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def logs_of(self, *names: str) -> str:
        return "\n".join(f"--- {n} ---\n{self.log(n)[-4000:]}" for n in names if n in self.logs)

    def stop_all(self) -> None:
        """Stop everything: workers cold (SIGQUIT: a `replace` task sleeps on), pumps SIGTERM."""
        procs = {
            name: p for s in self.stacks.values() for name, p in s.procs.items() if p.poll() is None
        }
        for name, proc in procs.items():
            proc.send_signal(signal.SIGQUIT if "worker" in name else signal.SIGTERM)
        procs = list(procs.values())
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_until(check: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return bool(check())


def history(fleet: Fleet, key: str, name: str) -> list[HistoryEntry]:
    repeat = fleet.repeat(key)
    try:
        return repeat.history(fleet.stacks[key].queue, name)
    finally:
        repeat.close()


def registration(fleet: Fleet, key: str, name: str) -> Registration:
    repeat = fleet.repeat(key)
    try:
        found = repeat.get(fleet.stacks[key].queue, name)
    finally:
        repeat.close()
    assert found is not None, f"no registration {name!r}"
    return found


def statuses(entries: list[HistoryEntry]) -> list[str]:
    return [e.status for e in entries]


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("celery-lifecycle")
    (tmp / "emql_app.py").write_text(APP)
    fleet = Fleet(redis_url, tmp)
    registry = EmbeddedServer().start()  # the outage stack's registry, stopped mid-run
    try:
        main = fleet.stack("main", redis_url)
        lost = fleet.stack("lost", redis_url)
        outage = fleet.stack("outage", registry.url)
        fleet.worker(main, "main-worker", concurrency=6)
        fleet.worker(lost, "lost-worker-1", concurrency=2)
        fleet.worker(outage, "outage-worker", concurrency=1)
        for index in range(3):
            fleet.pump(main, f"main-pump-{index}", *(["--pipelined"] if index == 2 else []))
        fleet.pump(lost, "lost-pump")
        fleet.pump(outage, "outage-pump")
        _drive(fleet, registry)
        yield fleet
    finally:
        fleet.stop_all()
        registry.stop()


def _ready(fleet: Fleet, *workers: str) -> bool:
    return all(name in fleet.logs and " ready." in fleet.log(name) for name in workers)


def _drive(fleet: Fleet, registry: EmbeddedServer) -> None:
    """Run until every scenario has what it needs, stepping the ones that need a hand."""
    main, lost = fleet.stacks["main"], fleet.stacks["lost"]
    assert wait_until(lambda: _ready(fleet, "main-worker", "lost-worker-1", "outage-worker"), 60), (
        fleet.logs_of("main-worker", "lost-worker-1", "outage-worker")
    )
    main_repeat, lost_repeat, outage_repeat = (fleet.repeat(k) for k in ("main", "lost", "outage"))
    assert wait_until(lambda: main_repeat.get(main.queue, "ok") is not None, 30)
    assert wait_until(lambda: outage_repeat.get(fleet.stacks["outage"].queue, "outage"), 30)
    for name in ("ok", "fail", "flaky", "selfkill", "hardlimit"):
        fleet.marks[f"trigger-{name}"] = main_repeat.trigger(main.queue, name)
    fleet.marks["trigger-outage"] = outage_repeat.trigger(fleet.stacks["outage"].queue, "outage")
    observed: list[tuple[int, bool]] = []  # (failures, paused) of `flop`, as seen
    fleet.marks["flop-observed"] = observed
    phase = "lost: wait for the first start"
    outage_phase = "wait for the start"

    def lost_step() -> None:
        nonlocal phase
        if phase == "lost: wait for the first start":
            starts = [n for n in fleet.notes("lost") if n["what"] == "start"]
            if starts:
                time.sleep(2 * HEARTBEAT_S)  # its start and a heartbeat are in
                os.killpg(lost.procs["lost-worker-1"].pid, signal.SIGKILL)
                lost.procs["lost-worker-1"].wait()
                fleet.marks["killed-at"] = time.time()
                fleet.marks["killed-id"] = starts[0]["id"]
                fleet.flag("lost", "killed")
                phase = "lost: wait for the mark"
        elif phase == "lost: wait for the mark":
            entries = history(fleet, "lost", "hang")
            if any(e.id == fleet.marks["killed-id"] and e.status == "lost" for e in entries):
                fleet.marks["lost-seen-at"] = time.time()
                fleet.worker(lost, "lost-worker-2", concurrency=2)
                phase = "lost: wait for a later success"
        elif (
            phase == "lost: wait for a later success"
            and statuses(history(fleet, "lost", "hang")).count("succeeded") >= 2
        ):
            phase = "done"

    def outage_step() -> None:
        nonlocal outage_phase
        if outage_phase == "wait for the start":
            if any(n["what"] == "start" for n in fleet.notes("outage")):
                time.sleep(2 * HEARTBEAT_S)  # its start report is in
                fleet.marks["outage-history"] = history(fleet, "outage", "outage")
                registry.stop()
                fleet.flag("outage", "down")
                outage_phase = "wait for the end"
        elif outage_phase == "wait for the end" and any(
            n["what"] == "end" for n in fleet.notes("outage")
        ):
            outage_phase = "done"

    def done() -> bool:
        flop = main_repeat.get(main.queue, "flop")
        if flop is not None:
            observed.append((flop.failures, flop.paused))
        lost_step()
        outage_step()
        slow = history(fleet, "main", "slow")
        replaced = history(fleet, "main", "replaced")
        triggered = {
            name: history(fleet, "main", name)
            for name in ("ok", "fail", "flaky", "selfkill", "hardlimit")
        }
        return (
            phase == "done"
            and outage_phase == "done"
            and statuses(slow).count("succeeded") >= 3
            and flop is not None
            and flop.paused
            and "revoked" in statuses(replaced)
            and all(e and e[0].status not in ("running", "retrying") for e in triggered.values())
        )

    try:
        wait_until(done, timeout_s=90, poll_s=0.2)
        fleet.marks["phases"] = (phase, outage_phase)
        # What the outage worker logged once it finished (its success line is written last).
        wait_until(lambda: "succeeded in" in fleet.log("outage-worker"), 10)
    finally:
        for repeat in (main_repeat, lost_repeat):
            repeat.close()


# -- what each run became -------------------------------------------------------------------


def only(entries: list[HistoryEntry], ident: str) -> HistoryEntry:
    found = [e for e in entries if e.id == ident]
    assert len(found) == 1, entries
    return found[0]


def test_a_run_that_succeeds_is_in_the_history_as_succeeded_with_its_times(fleet: Fleet) -> None:
    entry = only(history(fleet, "main", "ok"), fleet.marks["trigger-ok"])
    assert (entry.status, entry.attempt, entry.triggered, entry.error) == (
        "succeeded",
        1,
        True,
        None,
    )
    assert entry.released_ms is not None and entry.duration_ms is not None
    record = registration(fleet, "main", "ok")
    assert (record.last_status, record.last_success_ms) == ("succeeded", entry.finished_ms)


def test_a_run_that_raises_is_failed_with_its_error(fleet: Fleet) -> None:
    entry = only(history(fleet, "main", "fail"), fleet.marks["trigger-fail"])
    assert (entry.status, entry.attempt) == ("failed", 1)
    assert entry.error == "ValueError: it always fails"
    record = registration(fleet, "main", "fail")
    assert (record.failures, record.last_error) == (1, "ValueError: it always fails")


def test_a_run_retried_once_then_succeeding_is_succeeded_at_attempt_2(fleet: Fleet) -> None:
    entry = only(history(fleet, "main", "flaky"), fleet.marks["trigger-flaky"])
    assert (entry.status, entry.attempt) == ("succeeded", 2)
    assert entry.duration_ms is not None
    runs = [n for n in fleet.notes("main") if n["id"] == fleet.marks["trigger-flaky"]]
    assert [n["retries"] for n in runs] == [0, 1]  # one retry, the same occurrence


def test_a_pool_process_killed_under_its_task_is_failed_with_worker_lost_error(
    fleet: Fleet,
) -> None:
    entry = only(history(fleet, "main", "selfkill"), fleet.marks["trigger-selfkill"])
    assert entry.status == "failed", fleet.logs_of("main-worker")
    assert entry.error is not None and entry.error.startswith("WorkerLostError:"), entry.error


def test_a_task_killed_by_its_hard_time_limit_is_failed_with_time_limit_exceeded(
    fleet: Fleet,
) -> None:
    # Celery (5.7 here) sends `task_failure` from the main process for a hard time limit:
    # the run is failed at once, not lost after its heartbeats stop.
    entry = only(history(fleet, "main", "hardlimit"), fleet.marks["trigger-hardlimit"])
    assert entry.status == "failed", fleet.logs_of("main-worker")
    assert entry.error is not None and entry.error.startswith("TimeLimitExceeded"), entry.error
    assert entry.duration_ms is not None and 900 <= entry.duration_ms < 10_000, entry


def test_replace_revokes_the_running_task_and_its_run_is_revoked(fleet: Fleet) -> None:
    entries = history(fleet, "main", "replaced")
    revoked = [e for e in entries if e.status == "revoked"]
    assert revoked, entries
    started = {n["id"] for n in fleet.notes("main") if n["task"] == "emql.replaced"}
    assert any(e.id in started and e.started_ms is not None for e in revoked), (
        "a task was revoked while it ran"
    )
    # The pump that sent the next slot revoked the previous one through the dispatcher.
    pumps = fleet.logs_of("main-pump-0", "main-pump-1", "main-pump-2")
    assert "(revoked)" in pumps
    assert "this framework cannot revoke it" not in pumps


# -- skip, with three pumps racing -------------------------------------------------------------


def test_skip_never_runs_two_slots_at_once_across_three_pumps_and_counts_what_it_skips(
    fleet: Fleet,
) -> None:
    entries = sorted(history(fleet, "main", "slow"), key=lambda e: e.due_ms)
    ran = [e for e in entries if e.status == "succeeded"]
    assert len(ran) >= 3, entries
    assert "lost" not in statuses(entries), "heartbeats kept the 2.5 s runs in flight"
    for before, after in itertools.pairwise(ran):
        assert before.finished_ms is not None and after.started_ms is not None
        assert after.started_ms >= before.finished_ms, f"{before} overlaps {after}"
    skipped = [e for e in entries if e.status == "skipped"]
    record = registration(fleet, "main", "slow")
    assert record.skipped >= len(skipped) >= 1
    starts = [n for n in fleet.notes("main") if n["task"] == "emql.slow" and n["what"] == "start"]
    assert len({n["id"] for n in starts}) == len(starts), "no slot ran twice"


def test_a_task_reads_the_slot_fired_before_and_the_last_success(fleet: Fleet) -> None:
    entries = history(fleet, "main", "slow")
    finished = {e.due_ms: e.finished_ms for e in entries if e.status == "succeeded"}
    starts = sorted(
        (n for n in fleet.notes("main") if n["task"] == "emql.slow" and n["what"] == "start"),
        key=lambda n: n["due"],
    )
    assert len(starts) >= 3
    assert (starts[0]["previous"], starts[0]["last_success"]) == (None, None)
    for before, after in itertools.pairwise(starts):
        assert after["previous"] == before["due"], "the slot fired before (not a skipped one)"
        earlier = {finished.get(n["due"]) for n in starts if n["due"] < after["due"]}
        assert after["last_success"] in earlier


# -- pause after failures --------------------------------------------------------------------


def test_pause_after_failures_pauses_at_the_third_consecutive_failure_not_before(
    fleet: Fleet,
) -> None:
    record = registration(fleet, "main", "flop")
    assert record.paused
    assert record.failures == 3
    assert record.parked_reason is not None
    assert record.parked_reason.startswith("paused after 3 consecutive failures")
    assert "ValueError: it always fails" in record.parked_reason
    # One run at a time (skip): had it paused sooner there would be fewer, later more.
    assert statuses(history(fleet, "main", "flop")).count("failed") == 3
    observed = fleet.marks["flop-observed"]
    assert all(failures >= 3 for failures, paused in observed if paused), observed


# -- a killed worker, an unreachable registry ------------------------------------------------


def test_a_sigkilled_worker_leaves_its_run_lost_within_the_bound_and_skip_goes_on(
    fleet: Fleet,
) -> None:
    assert fleet.marks["phases"][0] == "done", fleet.logs_of("lost-pump", "lost-worker-2")
    entries = history(fleet, "lost", "hang")
    killed = only(entries, fleet.marks["killed-id"])
    assert killed.status == "lost"
    assert registration(fleet, "lost", "hang").lost >= 1
    # Marked by the pump once its heartbeats stopped: 3 heartbeats, plus one pump sleep
    # (with room for the test's own polling and a loaded machine).
    assert fleet.marks["lost-seen-at"] - fleet.marks["killed-at"] <= LOST_BOUND_S + 5
    later = [e for e in entries if e.due_ms > killed.due_ms and e.status == "succeeded"]
    assert len(later) >= 2, "the skip schedule runs again once its run is lost"
    assert "occurrence reports are dropped" not in fleet.log("lost-worker-2")


def test_a_registry_down_mid_run_leaves_the_task_untouched_and_logs_one_wait_line(
    fleet: Fleet,
) -> None:
    assert fleet.marks["phases"][1] == "done", fleet.logs_of("outage-worker", "outage-pump")
    before = fleet.marks["outage-history"]
    assert statuses(before) == ["running"], "its start was reported while the registry was up"
    ends = [n for n in fleet.notes("outage") if n["what"] == "end"]
    assert [n["id"] for n in ends] == [fleet.marks["trigger-outage"]]
    log = fleet.log("outage-worker")
    assert "succeeded in" in log and "done without its registry" in log
    # Since session 29 the reports wait for the registry (kept, sent once it is back), so the
    # line read while it is still down is the wait's, not a drop's.
    waits = [line for line in log.splitlines() if "occurrence reports wait until Redis" in line]
    assert len(waits) == 1, waits
    assert "the tasks are not affected" in waits[0]
    assert "Traceback" not in log
