"""The occurrence lifecycle on Dramatiq: real `dramatiq` worker processes report what became
of each occurrence, and the registry's overlap and failure policies act on those reports.

One app module is written per test directory and run with `python -m dramatiq`; the
environment picks its registry, its queue and which group of schedules it declares:

* `outcomes`: one `dramatiq` command with 3 worker processes, so 3 pumps race for every
  slot. Its schedules fire every second: succeeded, retried-then-succeeded, failed (a streak
  that pauses), skipped (by the actor and by a middleware), and three 2.5 s actors under the
  overlap policies `skip`, `buffer_one` and `allow`. It runs once for the module; each test
  waits for what it checks.
* `kill`: two `dramatiq` commands; the one running a hung occurrence is SIGKILLed and the
  other one's pump marks it lost.
* `outage`: the registry is an `EmbeddedServer` of its own, stopped while an actor runs.

Worker clocks and the server's are one host's, so started/finished intervals compare.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from quiet import quiet_offset

from emq_bridge import ConfigError, Pump, Repeat, ScheduleError
from emq_bridge.dramatiq import (
    OPTION_LAST_SUCCESS_MS,
    OPTION_PREVIOUS_DUE_MS,
    OPTION_RELEASED_MS,
    DramatiqDispatcher,
    PipelinedDramatiqDispatcher,
    RecurringMiddleware,
    RecurringOptionError,
    Schedule,
    broker_declarations,
    build_message,
    current_occurrence,
    every,
    occurrence_of,
    recurring,
    register,
)
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.lifecycle import START_TIMEOUT_MS
from emq_bridge.occurrence import Occurrence
from emq_bridge.outcome import HistoryEntry
from emq_bridge.testing import RecordingDispatcher

HEARTBEAT_S = 0.5
MAX_SLEEP_S = 0.5
# A running occurrence whose worker died is lost 3 heartbeats after its last one, and the
# next pump scan (at most `max_sleep_s` later) marks it: the bound docs/dramatiq.md gives.
LOST_BOUND_S = 3 * HEARTBEAT_S + MAX_SLEEP_S
# Slack for a loaded CI machine on top of that bound; and the most a slot's claim may lag
# its due time, or a report the end of its run, in the overlap checks.
SLACK_S = 3.0
CLAIM_MARGIN_MS = 400
SLOW_S = 2.5

APP = textwrap.dedent("""
    import json
    import os
    import time

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import CurrentMessage, SkipMessage

    from emq_bridge.dramatiq import RecurringMiddleware, current_occurrence, recurring

    env = os.environ
    P, Q, GROUP = env["LC_PREFIX"], env["LC_QUEUE"], env["LC_GROUP"]
    broker = RedisBroker(url=env["LC_BROKER"], namespace=env["LC_NAMESPACE"])
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(
        RecurringMiddleware(
            env.get("LC_REGISTRY") or None,
            prefix=P,
            max_sleep_s=float(env["LC_MAX_SLEEP_S"]),
            heartbeat_s=float(env["LC_HEARTBEAT_S"]),
        )
    )
    dramatiq.set_broker(broker)
    results = redis.Redis.from_url(env["LC_BROKER"])


    def note(kind, **fields):
        results.rpush(f"{P}:{kind}", json.dumps(fields))


    def schedule(group, **options):
        # Each test's app declares only its group's schedules; the actors exist in all.
        def attach(actor):
            return recurring(**options)(actor) if group == GROUP else actor
        return attach


    @schedule("outcomes", every=1)
    @dramatiq.actor(queue_name=Q)
    def succeeds():
        info = current_occurrence()
        note(
            "succeeds",
            id=info.id,
            due_ms=info.due_ms,
            released_ms=info.released_ms,
            previous_due_ms=info.previous_due_ms,
            last_success_ms=info.last_success_ms,
        )


    @schedule("outcomes", every=1)
    @dramatiq.actor(queue_name=Q, max_retries=1, min_backoff=100, max_backoff=200)
    def retried():
        if current_occurrence().attempt == 1:
            raise ValueError("the first attempt fails")


    @schedule("outcomes", every=1)
    @dramatiq.actor(queue_name=Q)
    def skips():
        raise SkipMessage("the actor skips this one")


    @schedule("outcomes", every=1)
    @dramatiq.actor(queue_name=Q, max_age=1)
    def too_old():  # Dramatiq's AgeLimit skips it before it starts
        note("too_old")


    @schedule("outcomes", every=1, pause_after_failures=3)
    @dramatiq.actor(queue_name=Q, max_retries=0)
    def streak():  # fails, fails, succeeds, then fails until paused
        if results.incr(f"{P}:streak") != 3:
            raise ValueError("streak failure")


    @schedule("outcomes", every=1, overlap="skip")
    @dramatiq.actor(queue_name=Q)
    def slow_skip():
        message = CurrentMessage.get_current_message()
        note("slow_skip", id=current_occurrence().id, options=message.options)
        time.sleep(float(env["LC_SLOW_S"]))


    @schedule("outcomes", every=1, overlap="buffer_one")
    @dramatiq.actor(queue_name=Q)
    def slow_buffer():
        time.sleep(float(env["LC_SLOW_S"]))


    @schedule("outcomes", every=1)
    @dramatiq.actor(queue_name=Q)
    def slow_allow():
        time.sleep(float(env["LC_SLOW_S"]))


    # Triggered only: its hourly slot is far from now (a top of the hour would run it again).
    @schedule("outcomes", every="1h", offset=env["LC_OFFSET"])
    @dramatiq.actor(queue_name=Q)
    def once():
        message = CurrentMessage.get_current_message()
        note("once", message_id=message.message_id, options=message.options)


    @schedule("kill", every=1, overlap="skip")
    @dramatiq.actor(queue_name=Q)
    def hangs():
        if results.set(f"{P}:hung", 1, nx=True):  # the first run hangs until killed
            message = CurrentMessage.get_current_message()
            note("hangs", id=current_occurrence().id, ppid=os.getppid(), options=message.options)
            time.sleep(120)


    @dramatiq.actor(queue_name=Q)
    def hog():  # sent by a test: keeps the one worker thread busy until the worker is killed
        note("hog", ppid=os.getppid())
        time.sleep(120)


    @dramatiq.actor(queue_name=Q)
    def short_hog():  # sent by a test: keeps the one worker thread busy for a while
        note("short_hog")
        time.sleep(3)


    @schedule("prefetch", every="1h", overlap="skip", immediately=True)
    @dramatiq.actor(queue_name=Q)
    def held():
        note("held")


    @schedule("retryhold", every="1h", overlap="skip", immediately=True)
    @dramatiq.actor(queue_name=Q, max_retries=1, min_backoff=3_600_000, max_backoff=3_600_000)
    def retries_later():  # its retry waits an hour in a worker's delay queue
        if results.incr(f"{P}:retries_later") == 1:
            raise RuntimeError("first attempt")


    @schedule("aged", every=1, overlap="skip")
    @dramatiq.actor(queue_name=Q, max_age=5000)
    def aged_slow():  # AgeLimit skips a copy sent with an old timestamp, before it starts
        message = CurrentMessage.get_current_message()
        note("aged_slow", id=current_occurrence().id, options=message.options)
        time.sleep(float(env["LC_SLOW_S"]))


    @schedule("outage", every="1h")
    @dramatiq.actor(queue_name=Q)
    def outlives():
        results.set(f"{P}:running", 1)
        deadline = time.monotonic() + 60
        while not results.exists(f"{P}:registry-stopped") and time.monotonic() < deadline:
            time.sleep(0.05)
        results.set(f"{P}:done", 1)
""")


@dataclass
class App:
    """A generated app module, its names and the `dramatiq` commands started on it."""

    root: Path
    prefix: str
    queue: str
    namespace: str
    module: str
    env: dict[str, str]
    workers: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, processes: int, threads: int) -> subprocess.Popen[bytes]:
        log = self.root / f"worker{len(self.workers)}.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dramatiq", self.module, "--path", str(self.root)),
                    *("--processes", str(processes), "--threads", str(threads)),
                ],
                cwd=self.root,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, to kill it with its children
            )
        self.workers.append((worker, log))
        return worker

    def log(self, worker: subprocess.Popen[bytes]) -> str:
        return next(log for w, log in self.workers if w is worker).read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(log.read_text(errors="replace") for _, log in self.workers)

    def alive(self) -> None:
        for worker, log in self.workers:
            if worker.poll() is not None and worker.returncode != -signal.SIGKILL:
                raise AssertionError(f"a worker exited: {log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        for worker, _ in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker, _ in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()


def build_app(root: Path, broker_url: str, group: str, registry_url: str | None = None) -> App:
    token = uuid.uuid4().hex[:8]
    prefix = f"lc{token}"
    app = App(root, prefix, f"q{token}", f"ns{token}", f"lc_app_{token}", {})
    (root / f"{app.module}.py").write_text(APP)
    app.env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        "LC_BROKER": broker_url,
        "LC_REGISTRY": registry_url or "",
        "LC_PREFIX": prefix,
        "LC_QUEUE": app.queue,
        "LC_NAMESPACE": app.namespace,
        "LC_GROUP": group,
        "LC_HEARTBEAT_S": str(HEARTBEAT_S),
        "LC_MAX_SLEEP_S": str(MAX_SLEEP_S),
        "LC_SLOW_S": str(SLOW_S),
        "LC_OFFSET": quiet_offset(),
    }
    return app


def clean(client: redis.Redis, app: App) -> None:
    for pattern in (f"{app.namespace}:*", f"{app.prefix}:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


def wait_for(
    condition: Callable[[], Any], app: App, timeout_s: float = 45.0, what: str = "condition"
) -> Any:
    """Poll `condition` until it returns something truthy (returned); fail on a dead worker."""
    deadline = time.monotonic() + timeout_s
    while True:
        app.alive()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def notes(client: redis.Redis, app: App, kind: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(f"{app.prefix}:{kind}", 0, -1)]


def enqueue_again(
    redis_url: str, app: App, actor_name: str, options: dict[str, Any], message_id: str
) -> dramatiq.Message[Any]:
    """Enqueue a message an actor of `app` already ran, with its options (a new Redis id):
    what a broker does when it delivers a message again."""
    broker = RedisBroker(url=redis_url, namespace=app.namespace)
    try:
        dramatiq.actor(broker=broker, queue_name=app.queue, actor_name=actor_name)(lambda: None)
        return broker.enqueue(
            dramatiq.Message(
                queue_name=app.queue,
                actor_name=actor_name,
                args=(),
                kwargs={},
                options={k: v for k, v in options.items() if k != "redis_message_id"},
                message_id=message_id,
            )
        )
    finally:
        broker.close()


def runs(history: list[HistoryEntry]) -> list[HistoryEntry]:
    """The occurrences that ran to their end, in the order they started."""
    done = [e for e in history if e.started_ms is not None and e.finished_ms is not None]
    return sorted(done, key=lambda e: e.started_ms or 0)


def finished_runs(repeat: Repeat, queue: str, name: str, n: int) -> list[HistoryEntry] | None:
    found = runs([e for e in repeat.history(queue, name) if e.status == "succeeded"])
    return found if len(found) >= n else None


# -- the `outcomes` group: 3 worker processes, 3 pumps --------------------------------------


def running_group(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    group: str,
    processes: int,
    threads: int,
) -> Iterator[tuple[App, Repeat, redis.Redis]]:
    """The app of `group`, its workers started; stopped and its keys removed after (the
    body of a module fixture)."""
    client = redis.Redis.from_url(redis_url)
    app = build_app(tmp_path_factory.mktemp(group), redis_url, group)
    repeat = Repeat(client, app.prefix)
    app.start(processes=processes, threads=threads)
    try:
        yield app, repeat, client
    finally:
        app.stop()
        clean(client, app)
        client.close()


@pytest.fixture(scope="module")
def outcomes(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[App, Repeat, redis.Redis]]:
    yield from running_group(tmp_path_factory, redis_url, "outcomes", processes=3, threads=6)


slow = pytest.mark.slow
timeout = pytest.mark.timeout(120)


@slow
@timeout
def test_a_success_is_in_the_history_and_the_next_run_sees_it_as_its_previous_run(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, repeat, client = outcomes
    done = wait_for(
        lambda: finished_runs(repeat, app.queue, "succeeds", 3), app, what="3 successes"
    )
    assert all(e.attempt == 1 and e.error is None for e in done)
    assert all(e.duration_ms is not None and e.duration_ms >= 0 for e in done)
    assert all(e.released_ms is not None and e.released_ms >= e.due_ms for e in done)
    by_id = {n["id"]: n for n in notes(client, app, "succeeds")}
    for before, after in pairwise(done):
        seen = by_id[after.id]
        # The slot fired before, and the success a worker reported of it.
        assert seen["previous_due_ms"] == before.due_ms
        assert seen["last_success_ms"] == before.finished_ms
        assert seen["released_ms"] == after.released_ms
    registration = repeat.get(app.queue, "succeeds")
    assert registration is not None and registration.failures == 0
    assert registration.last_success_ms is not None


@slow
@timeout
def test_a_failed_attempt_that_dramatiq_retries_is_one_occurrence_that_succeeds_at_attempt_2(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, repeat, _ = outcomes
    done = wait_for(lambda: finished_runs(repeat, app.queue, "retried", 2), app, what="retries")
    assert [e.attempt for e in done] == [2] * len(done)
    assert all(e.duration_ms is not None and e.error is None for e in done)
    assert len({e.id for e in done}) == len(done)  # one entry per occurrence, not per attempt
    registration = repeat.get(app.queue, "retried")
    assert registration is not None
    assert registration.failures == 0  # a retry is not a failure
    assert registration.last_error == "ValueError: the first attempt fails"  # kept from attempt 1


@slow
@timeout
def test_skip_message_from_the_actor_or_a_middleware_is_reported_skipped(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, repeat, client = outcomes

    def skipped(name: str) -> list[HistoryEntry] | None:
        found = [e for e in repeat.history(app.queue, name) if e.status == "skipped"]
        return found if len(found) >= 2 else None

    by_actor = wait_for(lambda: skipped("skips"), app, what="skips by the actor")
    assert all(e.attempt == 1 and e.duration_ms is not None for e in by_actor)  # it started
    by_middleware = wait_for(lambda: skipped("too_old"), app, what="skips by AgeLimit")
    assert all(e.started_ms is None and e.finished_ms is not None for e in by_middleware)
    assert notes(client, app, "too_old") == []  # it never ran
    for name in ("skips", "too_old"):
        registration = repeat.get(app.queue, name)
        assert registration is not None and registration.last_status == "skipped"


@slow
@timeout
def test_pause_after_failures_pauses_after_the_third_consecutive_failure_and_not_before(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, repeat, client = outcomes

    def paused() -> Any:
        registration = repeat.get(app.queue, "streak")
        return registration if registration is not None and registration.paused else None

    registration = wait_for(paused, app, what="the streak to pause")
    assert registration.parked_reason == (
        "paused after 3 consecutive failures; last: ValueError: streak failure"
    )
    assert registration.failures == 3
    time.sleep(1.5)  # a slot more would have fired by now, were it not paused
    history = list(reversed(repeat.history(app.queue, "streak")))
    # Two failures, then a success that ends the streak, then three failures: paused.
    assert [e.status for e in history] == ["failed"] * 2 + ["succeeded"] + ["failed"] * 3
    assert all(e.error == "ValueError: streak failure" for e in history if e.status == "failed")
    assert int(client.get(f"{app.prefix}:streak") or 0) == 6


@slow
@timeout
def test_skip_never_runs_two_at_once_and_counts_the_slots_it_skipped(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, repeat, _ = outcomes
    done = wait_for(lambda: finished_runs(repeat, app.queue, "slow_skip", 3), app, what="3 runs")
    for before, after in pairwise(done):
        assert after.started_ms >= before.finished_ms, f"{before} overlaps {after}"
        # A slot that came well before the run in flight ended was skipped, not sent later.
        assert after.due_ms > before.finished_ms - CLAIM_MARGIN_MS
    history = repeat.history(app.queue, "slow_skip")
    skipped = [e for e in history if e.status == "skipped"]
    assert len(skipped) >= len(done)  # a 2.5 s run on a 1 s cadence skips two slots
    registration = repeat.get(app.queue, "slow_skip")
    assert registration is not None
    assert registration.skipped >= len(skipped)  # counted even past what the history keeps
    # Each skipped slot came while an occurrence was in flight: claimed, not yet finished.
    now_ms = repeat.server_time_ms()
    windows = [(e.due_ms, e.finished_ms or now_ms) for e in history if e.status != "skipped"]
    for slot in skipped:
        assert any(due < slot.due_ms <= end + CLAIM_MARGIN_MS for due, end in windows), slot


@slow
@timeout
def test_buffer_one_keeps_one_slot_and_runs_it_as_soon_as_the_running_one_ends(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, repeat, _ = outcomes
    done = wait_for(lambda: finished_runs(repeat, app.queue, "slow_buffer", 3), app, what="3 runs")
    dues = [e.due_ms for e in runs(repeat.history(app.queue, "slow_buffer"))]
    for before, after in pairwise(done):
        assert after.started_ms >= before.finished_ms, f"{before} overlaps {after}"
        # The next run is the slot that waited while this one ran, not a later fresh slot.
        assert before.due_ms < after.due_ms < before.finished_ms + CLAIM_MARGIN_MS
        # At most one waited: of the slots that came during a run, one ran, others skipped.
        waited = [d for d in dues if before.due_ms < d < before.finished_ms - CLAIM_MARGIN_MS]
        assert len(waited) <= 1, (before, waited)
    registration = repeat.get(app.queue, "slow_buffer")
    assert registration is not None and registration.skipped >= 1


@slow
@timeout
def test_allow_lets_runs_overlap(outcomes: tuple[App, Repeat, redis.Redis]) -> None:
    app, repeat, _ = outcomes
    done = wait_for(lambda: finished_runs(repeat, app.queue, "slow_allow", 3), app, what="3 runs")
    assert any(after.started_ms < before.finished_ms for before, after in pairwise(done))
    assert [e for e in repeat.history(app.queue, "slow_allow") if e.status == "skipped"] == []
    registration = repeat.get(app.queue, "slow_allow")
    assert registration is not None and registration.skipped == 0


@slow
@timeout
def test_a_redelivered_message_reports_again_and_changes_nothing(
    outcomes: tuple[App, Repeat, redis.Redis], redis_url: str
) -> None:
    app, repeat, client = outcomes
    repeat.trigger(app.queue, "once")
    first = wait_for(lambda: finished_runs(repeat, app.queue, "once", 1), app, what="one run")
    [seen] = notes(client, app, "once")
    assert seen["message_id"] == first[0].id
    before_history = repeat.history(app.queue, "once")
    before = repeat.get(app.queue, "once")
    enqueue_again(redis_url, app, "once", seen["options"], seen["message_id"])
    wait_for(lambda: len(notes(client, app, "once")) == 2, app, what="the second run")
    time.sleep(1.0)  # its started and succeeded reports are sent within milliseconds
    assert repeat.history(app.queue, "once") == before_history
    assert repeat.get(app.queue, "once") == before


@slow
@timeout
def test_a_guarded_message_delivered_again_while_another_runs_is_skipped_not_run(
    outcomes: tuple[App, Repeat, redis.Redis], redis_url: str
) -> None:
    # What a broker does with a killed worker's message once its occurrence was marked lost
    # (Dramatiq's Redis broker requeues it up to a minute later): it comes again while the
    # next slot runs. The worker asks before it runs it, and skips it.
    app, repeat, client = outcomes
    old = wait_for(lambda: finished_runs(repeat, app.queue, "slow_skip", 1), app, what="a run")[0]
    [seen] = [n for n in notes(client, app, "slow_skip") if n["id"] == old.id]
    assert seen["options"]["emq_guarded"] is True

    def another_just_started() -> bool:
        now_ms = repeat.server_time_ms()
        return any(
            e.status == "running" and e.id != old.id and now_ms - (e.started_ms or 0) < 1000
            for e in repeat.history(app.queue, "slow_skip")
        )

    wait_for(another_just_started, app, what="another run in flight, started within 1 s")
    message = enqueue_again(redis_url, app, "slow_skip", seen["options"], old.id)
    messages = f"{app.namespace}:{app.queue}.msgs"
    redis_id = message.options["redis_message_id"]
    assert client.hexists(messages, redis_id)  # enqueued where the workers consume
    wait_for(lambda: not client.hexists(messages, redis_id), app, what="the message acked")
    assert [n["id"] for n in notes(client, app, "slow_skip")].count(old.id) == 1
    [entry] = [e for e in repeat.history(app.queue, "slow_skip") if e.id == old.id]
    assert entry.status == "succeeded"  # its own run's outcome, not changed by the skip


@slow
@timeout
def test_a_guarded_message_delivered_again_while_its_own_run_goes_on_is_not_run_beside_it(
    outcomes: tuple[App, Repeat, redis.Redis], redis_url: str
) -> None:
    # A message the broker delivers twice while its first copy runs (a copy handed on as its
    # worker dies, or a visibility timeout shorter than the task): before, the copy ran
    # beside it. Now it is delivered again once the first copy's heartbeats would have
    # lapsed, and dropped then if the first copy ran (as here), run if its worker died.
    app, repeat, client = outcomes

    def just_started() -> HistoryEntry | None:
        now_ms = repeat.server_time_ms()
        return next(
            (
                e
                for e in repeat.history(app.queue, "slow_skip")
                if e.status == "running" and now_ms - (e.started_ms or 0) < 500
            ),
            None,
        )

    running = wait_for(just_started, app, what="a run of slow_skip that just started")
    [seen] = wait_for(
        lambda: [n for n in notes(client, app, "slow_skip") if n["id"] == running.id], app
    )
    enqueue_again(redis_url, app, "slow_skip", seen["options"], running.id)

    def ended() -> bool:
        return any(
            e.id == running.id and e.status == "succeeded"
            for e in repeat.history(app.queue, "slow_skip")
        )

    wait_for(ended, app, what="the first copy's end")
    time.sleep(2 * (3 * HEARTBEAT_S + 1) + 1)  # the copy's deliveries are over
    assert [n["id"] for n in notes(client, app, "slow_skip")].count(running.id) == 1
    [entry] = [e for e in repeat.history(app.queue, "slow_skip") if e.id == running.id]
    assert entry.status == "succeeded" and (entry.duration_ms or 0) >= SLOW_S * 1000 - 100


@slow
@timeout
def test_no_middleware_hook_failed_in_the_three_worker_processes(
    outcomes: tuple[App, Repeat, redis.Redis],
) -> None:
    app, _, _ = outcomes
    output = app.logs()
    assert output.count("Worker process is ready for action") == 3, output[-3000:]
    # A hook that raised would be logged by Dramatiq as "Unexpected failure in ...", a report
    # that could not be built by the outcomes module.
    assert "Unexpected failure" not in output, output[-3000:]
    assert "emq_bridge.dramatiq.outcomes" not in output, output[-3000:]


# -- `kill`: a SIGKILLed worker's occurrence is lost, and the schedule goes on -------------


@slow
@timeout
def test_a_sigkilled_workers_running_occurrence_is_lost_within_the_bound_and_skip_goes_on(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    app = build_app(tmp_path, redis_url, "kill")
    repeat = Repeat(client, app.prefix)
    workers = [app.start(processes=1, threads=2), app.start(processes=1, threads=2)]
    try:
        [hung] = wait_for(lambda: notes(client, app, "hangs"), app, what="the hung run")

        def entry() -> HistoryEntry | None:
            return next((e for e in repeat.history(app.queue, "hangs") if e.id == hung["id"]), None)

        # Its start reaches the registry once the reporter's batch is sent (it gathers
        # reports for up to 50 ms), then heartbeats keep it running past 3 heartbeats: only
        # a dead worker is lost.
        wait_for(entry, app, what="the hung run's start in the registry")
        started = time.monotonic()
        while time.monotonic() - started < 2 * 3 * HEARTBEAT_S:
            current = entry()
            assert current is not None and current.status == "running", current
            time.sleep(0.1)
        [victim] = [w for w in workers if w.pid == hung["ppid"]]
        os.killpg(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        victim.wait()
        wait_for(
            lambda: (e := entry()) is not None and e.status == "lost",
            app,
            timeout_s=LOST_BOUND_S + SLACK_S,
            what=f"the lost mark (documented bound {LOST_BOUND_S}s)",
        )
        lost_after_s = time.monotonic() - killed
        assert lost_after_s <= LOST_BOUND_S + SLACK_S
        # The skip schedule is not blocked: a later slot runs on the surviving worker.
        wait_for(
            lambda: finished_runs(repeat, app.queue, "hangs", 1),
            app,
            what="a run after the lost one",
        )
        registration = repeat.get(app.queue, "hangs")
        assert registration is not None and registration.lost == 1
        [survivor] = [w for w in workers if w is not victim]
        assert "Unexpected failure" not in app.log(survivor)
    finally:
        app.stop()
        clean(client, app)


@slow
@timeout
def test_a_copy_waiting_while_its_run_runs_does_not_keep_that_run_in_flight_once_killed(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    # Session 38's review of a first version of the waiting heartbeat: a copy of a run that
    # runs elsewhere (sent again by the middleware, after its start check said the run goes
    # on, into a worker's delay queue) was heartbeated as waiting, and kept that run in
    # flight for ever once its worker was killed. A waiting heartbeat keeps nothing in
    # flight once a run of its attempt began.
    app = build_app(tmp_path, redis_url, "kill")
    repeat = Repeat(client, app.prefix)
    workers = [app.start(processes=1, threads=2), app.start(processes=1, threads=2)]
    try:
        [hung] = wait_for(lambda: notes(client, app, "hangs"), app, what="the hung run")

        def status() -> str | None:
            entries = [e for e in repeat.history(app.queue, "hangs") if e.id == hung["id"]]
            return entries[0].status if entries else None

        wait_for(lambda: status() == "running", app, what="the hung run's start in the registry")
        enqueue_again(redis_url, app, "hangs", hung["options"], hung["id"])
        time.sleep(4 * HEARTBEAT_S)  # the copy checked, sent again with a delay, heartbeated
        assert status() == "running"
        [victim] = [w for w in workers if w.pid == hung["ppid"]]
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        # Lost once the victim's heartbeats lapse; then the copy's next check finds no run in
        # flight and runs it (it returns at once: the hang was the first run's).
        wait_for(
            lambda: status() in ("lost", "succeeded"),
            app,
            timeout_s=LOST_BOUND_S + SLACK_S,
            what=f"the lost mark (documented bound {LOST_BOUND_S}s)",
        )
    finally:
        app.stop()
        clean(client, app)


@slow
@timeout
def test_a_guarded_message_a_killed_worker_held_unstarted_is_lost_within_the_bound(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    # Found by a chaos probe (session 38): a guarded occurrence waiting in a worker's queue
    # (its threads busy) died with that worker unheard of: its schedule stayed in flight
    # until the start timeout (10 minutes), every slot skipped, and the Redis broker handed
    # the message on only minutes later. The worker's reporter heartbeats such messages.
    app = build_app(tmp_path, redis_url, "prefetch")
    repeat = Repeat(client, app.prefix)
    broker = RedisBroker(url=redis_url, namespace=app.namespace)
    try:  # first in the queue: the worker's one thread takes it and is busy
        dramatiq.actor(broker=broker, queue_name=app.queue, actor_name="hog")(lambda: None).send()
    finally:
        broker.close()
    worker = app.start(processes=1, threads=1)
    try:
        wait_for(lambda: notes(client, app, "hog"), app, what="the hog's run")

        def waiting() -> Any:
            registration = repeat.get(app.queue, "held")
            return registration is not None and registration.inflight is not None

        wait_for(waiting, app, what="the guarded occurrence sent and in flight")
        time.sleep(4 * HEARTBEAT_S)  # heartbeated while it waits
        assert notes(client, app, "held") == []  # it waits behind the hog
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        pump = Pump(repeat, [app.queue], RecordingDispatcher(), max_sleep_s=MAX_SLEEP_S)

        def lost() -> Any:
            pump.run_once()
            return [e.status for e in repeat.history(app.queue, "held")] == ["lost"]

        wait_for(lost, app, timeout_s=LOST_BOUND_S + SLACK_S, what="the lost mark")
        registration = repeat.get(app.queue, "held")
        assert registration is not None and registration.inflight is None
    finally:
        app.stop()
        clean(client, app)


@slow
@timeout
def test_a_guarded_message_a_stopping_worker_held_unstarted_is_handed_back_and_runs_later(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    # A worker stopped gracefully requeues what it held unstarted: heartbeated as waiting
    # until then, the occurrence would be lost `3 * heartbeat_s` after the stop, with its
    # message still in the broker for the next worker. The stopping worker hands it back:
    # in flight for the start timeout from the stop, as a fresh send; it runs on the next
    # worker and is not lost meanwhile.
    app = build_app(tmp_path, redis_url, "prefetch")
    repeat = Repeat(client, app.prefix)
    broker = RedisBroker(url=redis_url, namespace=app.namespace)
    try:  # first in the queue: the worker's one thread takes it and is busy
        dramatiq.actor(broker=broker, queue_name=app.queue, actor_name="short_hog")(
            lambda: None
        ).send()
    finally:
        broker.close()
    worker = app.start(processes=1, threads=1)
    try:
        wait_for(lambda: notes(client, app, "short_hog"), app, what="the hog's run")

        def sent() -> Any:
            registration = repeat.get(app.queue, "held")
            return registration is not None and registration.inflight is not None

        wait_for(sent, app, what="the guarded occurrence sent and in flight")
        time.sleep(2 * HEARTBEAT_S)  # heartbeated while it waits (in flight for the TTL)
        ((_, deadline),) = client.zrange(repeat.keys(app.queue).running, 0, -1, withscores=True)
        seconds, _ = client.time()
        assert deadline - seconds * 1000 <= 3_000 * HEARTBEAT_S + 1_000
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        app.workers[:] = [w for w in app.workers if w[0] is not worker]  # stopped, as asked
        assert notes(client, app, "held") == []  # it never ran there
        time.sleep(3 * HEARTBEAT_S + MAX_SLEEP_S + 1)  # past the TTL its heartbeats gave
        ((_, deadline),) = client.zrange(repeat.keys(app.queue).running, 0, -1, withscores=True)
        seconds, _ = client.time()
        assert deadline - seconds * 1000 > START_TIMEOUT_MS - 60_000  # handed back
        Pump(repeat, [app.queue], RecordingDispatcher(), max_sleep_s=MAX_SLEEP_S).run_once()
        assert [e.status for e in repeat.history(app.queue, "held")] == []  # not lost
        app.start(processes=1, threads=1)
        wait_for(lambda: notes(client, app, "held"), app, what="the held message's run")

        def succeeded() -> Any:
            return [e.status for e in repeat.history(app.queue, "held")] == ["succeeded"]

        wait_for(succeeded, app, what="its success reported")
    finally:
        app.stop()
        clean(client, app)


@slow
@timeout
def test_a_retry_waiting_in_a_killed_workers_delay_queue_keeps_its_backoff(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    # The session's review: heartbeated as a waiting message, a retry's deadline came down
    # to the heartbeat TTL, so a worker killed while it held the retry had it marked lost
    # seconds later, its schedule's next slots sent, and the retry, given back by the broker
    # later, skipped as overlapping them: never run. It keeps its backoff plus the start
    # timeout, as `retrying` does.
    app = build_app(tmp_path, redis_url, "retryhold")
    repeat = Repeat(client, app.prefix)
    worker = app.start(processes=1, threads=1)
    try:

        def retrying() -> Any:
            return [(e.status, e.attempt) for e in repeat.history(app.queue, "retries_later")]

        wait_for(lambda: retrying() == [("retrying", 1)], app, what="the first attempt's retry")
        time.sleep(3 * HEARTBEAT_S)  # the retry in the delay queue, heartbeated as waiting
        ((_, deadline),) = client.zrange(repeat.keys(app.queue).running, 0, -1, withscores=True)
        seconds, _ = client.time()
        # Dramatiq's backoff has a jitter: from half the hour to the hour.
        assert deadline - seconds * 1000 > 1_800_000 + START_TIMEOUT_MS - 60_000
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        time.sleep(LOST_BOUND_S + 1)
        Pump(repeat, [app.queue], RecordingDispatcher(), max_sleep_s=MAX_SLEEP_S).run_once()
        assert retrying() == [("retrying", 1)]  # not lost: its broker gives the retry back
    finally:
        app.stop()
        clean(client, app)


# -- `outage`: the registry stops while an actor runs --------------------------------------


@slow
@timeout
def test_reports_never_raise_into_the_actor_when_the_registry_stops_mid_run(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    registry = EmbeddedServer().start()
    app = build_app(tmp_path, redis_url, "outage", registry_url=registry.url)
    try:
        with redis.Redis.from_url(registry.url) as registry_client:
            repeat = Repeat(registry_client, app.prefix)
            worker = app.start(processes=1, threads=2)
            wait_for(lambda: repeat.get(app.queue, "outlives"), app, what="the boot's sync")
            repeat.trigger(app.queue, "outlives")
            wait_for(
                lambda: [e for e in repeat.history(app.queue, "outlives") if e.status == "running"],
                app,
                what="the started report",
            )
        registry.stop()
        client.set(f"{app.prefix}:registry-stopped", 1)
        wait_for(lambda: client.exists(f"{app.prefix}:done"), app, what="the actor's side effect")
        time.sleep(3 * HEARTBEAT_S)  # its report and heartbeats are dropped meanwhile
        app.stop()
        output = app.log(worker)
        assert worker.returncode == 0, output[-3000:]
        assert output.count("occurrence reports are dropped until Redis takes them again") == 1
        assert "Failed to process message" not in output, output[-3000:]
        assert "Unexpected failure" not in output, output[-3000:]
    finally:
        app.stop()
        registry.stop()
        clean(client, app)


# -- declarations and messages (no worker process) -----------------------------------------


@pytest.mark.parametrize(
    "declare",
    [
        lambda: recurring(every=60, overlap="replace"),
        lambda: every(60, overlap="replace"),
        lambda: dramatiq.actor(
            lambda: None,
            broker=_stub(),
            actor_name="a",
            recurring={"every": 60, "overlap": "replace"},
        ),
        lambda: dramatiq.actor(
            lambda: None,
            broker=_stub(),
            actor_name="a",
            recurring=Schedule(every=60, overlap="replace"),
        ),
    ],
    ids=["decorator", "every", "option-dict", "option-schedule"],
)
def test_overlap_replace_is_refused_at_declaration_naming_skip_and_buffer_one(
    declare: Callable[[], object],
) -> None:
    with pytest.raises(ScheduleError) as raised:
        declare()
    assert "cannot revoke" in str(raised.value)
    assert "overlap='skip'" in str(raised.value) and "overlap='buffer_one'" in str(raised.value)


def _stub() -> StubBroker:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware("redis://127.0.0.1:1/0", run_pump=False))
    return broker


def test_overlap_and_pause_after_failures_reach_the_declaration_and_runtime_registrations(
    repeat: Repeat,
) -> None:
    broker = _stub()

    @recurring(every=60, overlap="buffer_one", pause_after_failures=3)
    @dramatiq.actor(broker=broker, queue_name="q")
    def guarded() -> None: ...

    @dramatiq.actor(broker=broker, queue_name="q", recurring=every(60, overlap="skip"))
    def optioned() -> None: ...

    found = {d.name: d.definition for d in broker_declarations(broker)}
    assert (found["guarded"].overlap, found["guarded"].pause_after_failures) == ("buffer_one", 3)
    assert (found["optioned"].overlap, found["optioned"].pause_after_failures) == ("skip", None)
    assert register(repeat, guarded, every=60, name="rt", overlap="skip", pause_after_failures=2)
    stored = repeat.get("q", "rt")
    assert stored is not None
    assert (stored.definition.overlap, stored.definition.pause_after_failures) == ("skip", 2)
    with pytest.raises(ScheduleError, match="buffer_one"):
        register(repeat, guarded, every=60, name="rt2", overlap="replace")
    with pytest.raises(ScheduleError, match="pause_after_failures"):
        recurring(every=60, pause_after_failures=0)


def test_a_schedule_file_asking_replace_for_an_actor_is_refused_at_boot(repeat: Repeat) -> None:
    from emq_bridge.definition import Declaration, define
    from emq_bridge.dramatiq import check_actors

    broker = StubBroker()
    dramatiq.actor(lambda: None, broker=broker, queue_name="q", actor_name="job")
    declaration = Declaration(
        "q", "job", define(every=60, template={"task": "job"}, overlap="replace")
    )
    with pytest.raises(ConfigError, match=re.escape("schedules.toml: schedule q/job: overlap=")):
        check_actors(broker, [declaration], "schedules.toml")


def test_middleware_options_are_checked(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="heartbeat_s"):
        RecurringMiddleware(heartbeat_s=0)
    with pytest.raises(ConfigError, match="history_size"):
        RecurringMiddleware(history_size=0)
    with pytest.raises(RecurringOptionError):
        dramatiq.actor(lambda: None, broker=_stub(), recurring={"every": 60, "overlap": "nope"})


def occurrence(**fields: Any) -> Occurrence:
    base: dict[str, Any] = {
        "queue": "q",
        "name": "job",
        "due_ms": 1_900_000_060_000,
        "id": str(uuid.uuid4()),
        "template": {"task": "job"},
        "released_ms": 1_900_000_060_004,
        "previous_due_ms": 1_900_000_000_000,
        "last_success_ms": 1_900_000_000_900,
    }
    return Occurrence(**{**base, **fields})


def test_both_dispatchers_carry_the_previous_run_context_that_occurrence_of_reads(
    redis_url: str, client: redis.Redis
) -> None:
    sent = occurrence()
    stub = StubBroker()
    dramatiq.actor(lambda: None, broker=stub, queue_name="q", actor_name="job")
    message = build_message(stub, sent)
    assert message.options[OPTION_RELEASED_MS] == sent.released_ms
    assert message.options[OPTION_PREVIOUS_DUE_MS] == sent.previous_due_ms
    assert message.options[OPTION_LAST_SUCCESS_MS] == sent.last_success_ms
    DramatiqDispatcher(stub).dispatch(sent)
    assert stub.queues["q"].qsize() == 1

    namespace = f"ns{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=namespace)
    try:
        dramatiq.actor(lambda: None, broker=broker, queue_name="q", actor_name="job")
        first = occurrence(previous_due_ms=None, last_success_ms=None)
        errors = PipelinedDramatiqDispatcher(broker).dispatch_batch([sent, first])
        assert errors == [None, None]
        decoded = {
            m.message_id: occurrence_of(m)
            for m in (dramatiq.Message.decode(raw) for raw in client.hvals(f"{namespace}:q.msgs"))
        }
    finally:
        broker.close()
        keys = list(client.scan_iter(match=f"{namespace}:*"))
        if keys:
            client.delete(*keys)
    info, fresh = decoded[sent.id], decoded[first.id]
    assert info is not None and fresh is not None
    assert (info.released_ms, info.previous_due_ms, info.last_success_ms) == (
        sent.released_ms,
        sent.previous_due_ms,
        sent.last_success_ms,
    )
    assert (
        info.previous_due is not None
        and info.previous_due.timestamp() * 1000 == sent.previous_due_ms
    )
    assert info.last_success is not None and info.released is not None
    assert (fresh.previous_due_ms, fresh.previous_due, fresh.last_success) == (None, None, None)
    assert info.attempt == 1


def test_without_reports_nothing_is_recorded_and_guarded_declarations_are_warned_about(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    broker = StubBroker()
    middleware = RecurringMiddleware(repeat, prefix=repeat.prefix, run_pump=False, report=False)
    broker.add_middleware(middleware)
    ran: list[int] = []

    # A top of the hour before the pump would send the hour's slot next to the trigger.
    @recurring(every="1h", offset=quiet_offset(), overlap="skip")
    @dramatiq.actor(broker=broker, queue_name="q")
    def job() -> None:
        info = current_occurrence()
        assert info is not None
        ran.append(info.attempt)

    worker = dramatiq.Worker(broker, worker_timeout=50)
    with caplog.at_level(logging.WARNING, "emq_bridge.dramatiq.middleware"):
        worker.start()
    try:
        assert "q/job declare an overlap or failure policy" in caplog.text
        repeat.trigger("q", "job")
        from emq_bridge import Pump

        Pump(repeat, ["q"], DramatiqDispatcher(broker)).run_once()
        broker.join("q")
        worker.join()
    finally:
        worker.stop()
    assert ran == [1]
    assert repeat.history("q", "job") == []
