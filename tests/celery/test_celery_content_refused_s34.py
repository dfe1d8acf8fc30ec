"""A message the worker refuses before it becomes a task (`ContentDisallowed`: the beat's
`task_serializer` changed to pickle before the workers' `accept_content` took it) is reported
`failed`, its task never run, so a guarded schedule goes on (found by a probe of Celery
message formats, session 34).

Before, nothing was reported: the occurrence stayed in flight for its start timeout (10
minutes), `show` said "none reported yet", and every slot of a `skip` schedule meanwhile was
skipped. Celery sends `task_rejected` for such a message (`Consumer.on_invalid_task`). A real
prefork worker (the app of `test_fix_celery_redelivered_copy`, json only) and a real Redis
broker.
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

app_dir = redelivered.app_dir


def test_a_refused_content_type_is_reported_and_holds_no_guarded_schedule(
    app_dir: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
    repeat = Repeat(client, prefix)
    repeat.register(
        queue,
        "pickled",
        every="1s",
        overlap="skip",
        pause_after_failures=2,
        template={"task": "rc.long"},
    )
    sender = Celery("rc-sender", broker=redis_url)
    sender.conf.update(result_backend=None, task_default_queue=queue, task_serializer="pickle")
    pump = Pump(repeat, [queue], CeleryDispatcher(sender))
    log = app_dir / "worker.log"
    worker = redelivered.start_worker(
        app_dir, redelivered.environment(app_dir, redis_url, prefix, queue), queue
    )
    try:
        sent: list[Any] = []

        def refused() -> list[str | None]:
            return [e.error for e in repeat.history(queue, "pickled") if e.status == "failed"]

        def three_refused() -> bool:
            sent.extend(pump.run_once().dispatched)  # one slot a second, none skipped
            return len(refused()) >= 3

        wait_until(three_refused, 60, "3 refused slots", then=lambda: log.read_text()[-3000:])
        assert all(e and e.startswith("ContentDisallowed: ") for e in refused()), refused()
        # Three slots sent and refused within the minute: none held the schedule in flight
        # (before, the second waited out the start timeout's 10 minutes; a slot that comes
        # before the worker's report of the one before is skipped, as under any guard).
        assert len({o.id for o in sent}) >= 3
        registration = repeat.get(queue, "pickled")
        assert registration is not None
        assert not registration.paused and registration.failures == 0  # its task never ran
    finally:
        stop(worker)
