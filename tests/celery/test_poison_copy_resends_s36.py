"""A guarded task that kills its pool process every time is sent again a bounded number of
times, not for ever (found by a probe of RabbitMQ quorum queues, session 36).

Its message is requeued at once (`acks_late`, `reject_on_worker_lost`), while the dead run's
heartbeats are still live: the copy is held and sent again once they lapse, and runs. Sent
again, it is a new message, whose broker delivery count starts again: a quorum queue's
`x-delivery-limit`, which drops such a message after a few deliveries without emq-bridge,
never did, and the occurrence ran (and killed a process) for ever. A copy now carries how
often it was sent so; past `MAX_RESENDS` it is dropped on receipt with a WARNING. A real
prefork worker, a real Redis broker, a real pump.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from processes import celery_pump, celery_worker, stop, wait_until

from emq_bridge import Repeat
from emq_bridge.celery.held_copies import RESENT_HEADER, times_resent
from emq_bridge.lifecycle import MAX_RESENDS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# As in test_requeue_outcomes_s32: longer than Celery takes to requeue a killed pool
# process's task, so each copy comes while the killed run's heartbeats are live.
HEARTBEAT_S = 4.0

APP = textwrap.dedent(f"""
    import json
    import os
    import signal
    import time

    import redis
    from celery import Celery

    env = os.environ
    app = Celery("poison", broker=env["PZ_REDIS"])
    app.conf.update(
        emq_bridge_redis_url=env["PZ_REDIS"],
        emq_bridge_prefix=env["PZ_PREFIX"],
        emq_bridge_heartbeat_s={HEARTBEAT_S},
        task_default_queue=env["PZ_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["PZ_REDIS"])


    @app.task(bind=True, name="pz.poison", acks_late=True, reject_on_worker_lost=True)
    def poison(self):
        side.rpush(env["PZ_PREFIX"] + ":runs", json.dumps({{"id": self.request.id}}))
        time.sleep(float(env["PZ_SLEEP_S"]))
        os.kill(os.getpid(), signal.SIGKILL)
""")


# The run kills its process once its start report is sent, or at once: before that report
# (the reporter sends within its linger), the copy is known by the run's mark (`begin.lua`'s
# `inflight_run`). Before, such a copy ran at once, unheld and uncounted, for ever (a probe of
# Celery's canvas and requeues, session 37).
@pytest.mark.parametrize("sleep_s", [0.3, 0.0], ids=["after-its-start-report", "at-once"])
def test_a_copy_whose_runs_kill_their_process_is_sent_again_a_bounded_number_of_times(
    redis_url: str, tmp_path: Path, sleep_s: float
) -> None:
    (tmp_path / "pz_app.py").write_text(APP)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-q"
    side = redis.Redis.from_url(redis_url)
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register(
        queue,
        "poison",
        every="1h",
        overlap="skip",
        immediately=True,
        template={"task": "pz.poison"},
    )
    worker, log = celery_worker(
        tmp_path,
        "pz_app",
        queue,
        {"PZ_REDIS": redis_url, "PZ_PREFIX": prefix, "PZ_QUEUE": queue, "PZ_SLEEP_S": str(sleep_s)},
    )

    def output() -> str:
        return log.read_text(errors="replace")

    try:
        with celery_pump(repeat, queue, redis_url):
            wait_until(
                lambda: "dropped on receipt: a copy of it was sent again" in output(),
                200,
                "the copy dropped past the bound",
                then=lambda: output()[-4000:],
            )
            time.sleep(2 * HEARTBEAT_S)  # nothing runs it again after that
            runs = [json.loads(r)["id"] for r in side.lrange(f"{prefix}:runs", 0, -1)]
            assert len(set(runs)) == 1, runs  # one occurrence
            assert len(runs) == MAX_RESENDS + 1, (runs, output()[-4000:])  # its run, re-sends
            assert output().count("held back is sent again") == MAX_RESENDS
            assert f"sent again {MAX_RESENDS} times already" in output()
    finally:
        stop(worker)
        side.close()


def test_a_resent_count_that_is_not_a_count_reads_as_none() -> None:
    """A negative count (a forged header) would have put the bound off by as much."""
    for value, expected in ((2, 2), (-1_000, 0), (True, 0), ("3", 0), (None, 0)):
        message = SimpleNamespace(headers={RESENT_HEADER: value})
        assert times_resent(message) == expected, value
    assert times_resent(SimpleNamespace(headers=None)) == 0
