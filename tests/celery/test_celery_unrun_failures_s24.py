"""A task the worker does not know (`NotRegistered`: an old worker meets a new task's message
during a rolling deploy) is reported `failed`, but never pauses its schedule.

Before, each such report counted toward `pause_after_failures`: a schedule with
`pause_after_failures=2` whose task only the new version registers paused itself after two
slots an old worker took, and stayed paused once the deploy ended. Now its task never ran,
so it neither counts toward the streak nor ends one. A real prefork worker (the app of
`test_fix_celery_redelivered_copy`, which has no `rc.ghost`) and a real Redis broker.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import test_fix_celery_redelivered_copy as redelivered
from celery import Celery
from processes import stop, wait_until

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# That test's fixture: its app (which has no task `rc.ghost`) written in a test directory.
app_dir = redelivered.app_dir

UNKNOWN = "NotRegistered: 'rc.ghost' is not a task of this worker"


def test_an_unknown_tasks_failures_never_pause_its_schedule(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    repeat.register(
        queue, "ghost", every="1s", pause_after_failures=2, template={"task": "rc.ghost"}
    )
    sender = Celery("rc-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    pump = Pump(repeat, [queue], CeleryDispatcher(sender))
    log = app_dir / "worker.log"
    env = redelivered.environment(app_dir, redis_url, prefix, queue)
    worker = redelivered.start_worker(app_dir, env, queue)
    try:
        sent: list[Any] = []

        def failed() -> list[str | None]:
            return [e.error for e in repeat.history(queue, "ghost") if e.status == "failed"]

        def three_failed_or_paused() -> bool:
            if len(sent) < 3:  # one slot a second, sent by this pump
                sent.extend(pump.run_once().dispatched)
            registration = repeat.get(queue, "ghost")
            return len(failed()) >= 3 or (registration is not None and registration.paused)

        def worker_log() -> str:
            return log.read_text(errors="replace")[-3000:]

        wait_until(three_failed_or_paused, 60, "3 failed slots", then=worker_log)
        registration = repeat.get(queue, "ghost")
        assert registration is not None
        assert not registration.paused and registration.parked_reason is None, registration
        assert registration.failures == 0
        assert (registration.last_status, registration.last_error) == ("failed", UNKNOWN)
        assert failed()[:3] == [UNKNOWN] * 3
    finally:
        stop(worker)
