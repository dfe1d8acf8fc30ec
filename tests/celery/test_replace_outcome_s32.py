"""`self.replace(sig)` in a scheduled task: the replacement's outcome is the occurrence's.

Found by a probe (session 32): Celery's `Task.replace` sends the replacement with the task's
own id and raises `Ignore`. The worker reported the run `skipped` at that `Ignore`, and the
replacement, sent without emq-bridge's headers, reported nothing and was not checked on
receipt: under `overlap="skip"` three replacements ran at once, and a replacement that
always failed never paused its schedule (fired 40, skipped 40, failures 0). Now the
replacement carries the occurrence's headers (a `before_task_publish` receiver in the
processes that run tasks), passes the check on receipt, and reports the occurrence's start
and end; the replaced run reports nothing and holds the occurrence in flight meanwhile.

Real prefork workers, a real Redis broker, a real pump.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from processes import celery_worker, stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HEARTBEAT_S = 0.5
SLOW_S = 2.5  # how long the slow replacement runs: the 1 s slots meanwhile are skipped

APP = textwrap.dedent(f"""
    import json
    import os
    import time

    import redis
    from celery import Celery

    env = os.environ
    app = Celery("rp", broker=env["RP_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["RP_BROKER"],
        emq_bridge_prefix=env["RP_PREFIX"],
        emq_bridge_heartbeat_s={HEARTBEAT_S},
        task_default_queue=env["RP_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["RP_BROKER"])
    NOTES = env["RP_PREFIX"] + ":notes"


    def note(task, what):
        request = task.request
        side.rpush(NOTES, json.dumps({{
            "task": task.name, "what": what, "id": request.id, "at": time.time(),
        }}))


    @app.task(bind=True, name="rp.slow_part")
    def slow_part(self):
        note(self, "start")
        time.sleep({SLOW_S})
        note(self, "end")
        return "done"


    @app.task(bind=True, name="rp.slow")
    def slow(self):
        note(self, "host")
        raise self.replace(slow_part.s())


    @app.task(bind=True, name="rp.bad_part")
    def bad_part(self):
        note(self, "start")
        time.sleep(0.2)
        raise ValueError("the replacement failed")


    @app.task(bind=True, name="rp.bad")
    def bad(self):
        note(self, "host")
        raise self.replace(bad_part.s())
""")


@dataclass
class Stack:
    queue: str
    repeat: Repeat
    broker: redis.Redis
    prefix: str
    log: Path

    def notes(self, task: str) -> list[dict[str, Any]]:
        raw = self.broker.lrange(f"{self.prefix}:notes", 0, -1)
        return [n for n in (json.loads(item) for item in raw) if n["task"] == task]

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    app_dir = tmp_path_factory.mktemp("replace")
    (app_dir / "rp_app.py").write_text(APP)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-q"
    broker = redis.Redis.from_url(redis_url)
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register(queue, "slow", every="1s", overlap="skip", template={"task": "rp.slow"})
    repeat.register(
        queue,
        "bad",
        every="1s",
        overlap="skip",
        pause_after_failures=2,
        template={"task": "rp.bad"},
    )
    worker, log = celery_worker(
        app_dir,
        "rp_app",
        queue,
        {"RP_BROKER": redis_url, "RP_PREFIX": prefix, "RP_QUEUE": queue},
        concurrency=6,
    )
    sender = Celery("rp-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    pump = Pump(repeat, [queue], CeleryDispatcher(sender), max_sleep_s=0.5)
    halt = threading.Event()
    thread = threading.Thread(target=pump.run, args=(halt,), daemon=True)
    try:
        wait_until(lambda: b"ready." in log.read_bytes(), 60, "the worker's start")
        thread.start()
        yield Stack(queue, repeat, broker, prefix, log)
    finally:
        halt.set()
        thread.join(10)
        stop(worker)
        sender.close()


def test_a_replaced_task_holds_its_skip_schedule_and_ends_with_its_replacement(
    stack: Stack,
) -> None:
    wait_until(
        lambda: len([n for n in stack.notes("rp.slow_part") if n["what"] == "end"]) >= 3,
        60,
        "three replacements' ends",
        then=stack.output,
    )
    runs: dict[str, dict[str, float]] = {}
    for note in stack.notes("rp.slow_part"):
        runs.setdefault(note["id"], {})[note["what"]] = note["at"]
    done = sorted((run["start"], run["end"], ident) for ident, run in runs.items() if "end" in run)
    # Before: each host was `skipped` at once, so the next 1 s slot was sent while the
    # replacement still ran: three ran at once.
    for (_, end, _), (start, _, ident) in itertools.pairwise(done):
        assert start >= end - 0.05, f"{ident} started while the one before still ran: {done}"

    def reported() -> bool:  # a run's end is noted before its reporter's thread sends it
        found = {e.id: e.status for e in stack.repeat.history(stack.queue, "slow")}
        return all(found.get(ident) not in (None, "running") for _, _, ident in done)

    wait_until(reported, 15, "the replacements' final reports", then=stack.output)
    entries = {e.id: e for e in stack.repeat.history(stack.queue, "slow")}
    for start, end, ident in done:
        entry = entries[ident]
        # Before: `skipped`, its error "Ignore: Replaced by new task".
        assert (entry.status, entry.attempt, entry.error) == ("succeeded", 1, None), entry
        assert entry.duration_ms is not None and entry.duration_ms >= SLOW_S * 1000 - 100
        assert entry.started_ms is not None and entry.started_ms >= round(start * 1000) - 50
        assert entry.finished_ms is not None and entry.finished_ms >= round(end * 1000) - 50
    skipped = [e for e in entries.values() if e.status == "skipped"]
    assert skipped and not {e.id for e in skipped} & set(runs), skipped
    output = stack.log.read_text(errors="replace")
    assert "revoked on receipt" not in output, output[-4000:]


def test_a_failing_replacement_pauses_its_schedule(stack: Stack) -> None:
    def paused() -> bool:
        registration = stack.repeat.get(stack.queue, "bad")
        return registration is not None and registration.paused

    # Before: never paused (each host `skipped`, its replacement unreported).
    wait_until(paused, 60, "the pause after two failures", then=stack.output)
    registration = stack.repeat.get(stack.queue, "bad")
    assert registration is not None
    assert (registration.failures, registration.last_error) == (
        2,
        "ValueError: the replacement failed",
    )
    failed = [e for e in stack.repeat.history(stack.queue, "bad") if e.status == "failed"]
    assert [(e.attempt, e.error) for e in failed] == [
        (1, "ValueError: the replacement failed"),
        (1, "ValueError: the replacement failed"),
    ]
    ran = {n["id"] for n in stack.notes("rp.bad_part")}
    assert {e.id for e in failed} <= ran


def test_the_pipelined_dispatcher_does_not_count_the_replacement_receiver() -> None:
    # The receiver is connected in a process once it runs a task emq-bridge sent; a beat that
    # runs there keeps its fast path (`_observed` counts the publish signals' receivers).
    from celery import signals

    from emq_bridge.celery import replacement
    from emq_bridge.celery.process_state import _process

    app = Celery("rp-pipelined", broker="redis://127.0.0.1:1/0")
    dispatcher = PipelinedCeleryDispatcher(app)
    before = dispatcher._observed()
    was_watching = _process.watching
    replacement._watch_replacements()
    try:
        assert any(
            key[0] == replacement.PUBLISH_RECEIVER_UID
            for key, _ in signals.before_task_publish.receivers
        )
        assert dispatcher._observed() == before
    finally:
        if not was_watching:  # as this test process was
            signals.before_task_publish.disconnect(dispatch_uid=replacement.PUBLISH_RECEIVER_UID)
            _process.watching = False
