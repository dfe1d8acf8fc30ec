"""A task that carries an occurrence's headers under another id is not that occurrence.

User code passes a task's headers on to the tasks it starts (tracing, a tenant id: the usual
`child.apply_async(headers=dict(self.request.headers))`), so the child carried
`emq_schedule`, `emq_due_ms` and the rest under its own task id. A worker took it for the
occurrence: its run was written in the registration's history beside the parent's, its
failure counted in the failure streak and became the schedule's last status, and under an
overlap policy it held the schedule in flight (a probe of Celery canvases, session 37; a
probe of hostile headers paused a schedule with three forged failures). A task is now an
occurrence only when its id is the one a pump gives it (`is_occurrence_id`); the child
runs as a plain task. A real prefork worker, a real pump.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
import redis
from processes import celery_pump, celery_worker, stop, wait_until

from emq_bridge import Repeat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import json
    import os

    import redis
    from celery import Celery

    env = os.environ
    app = Celery("passon", broker=env["PO_REDIS"])
    app.conf.update(
        emq_bridge_redis_url=env["PO_REDIS"],
        emq_bridge_prefix=env["PO_PREFIX"],
        task_default_queue=env["PO_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        imports=["emq_bridge.celery"],
    )
    side = redis.Redis.from_url(env["PO_REDIS"])


    def note(kind, ident):
        side.rpush(env["PO_PREFIX"] + ":runs", json.dumps([kind, ident]))


    @app.task(bind=True, name="po.parent")
    def parent(self):
        note("parent", self.request.id)
        child.apply_async(headers=dict(self.request.headers or {}))


    @app.task(bind=True, name="po.child")
    def child(self):
        note("child", self.request.id)
        raise ValueError("the child fails")
""")


def test_a_child_given_its_parents_headers_runs_as_a_plain_task_and_is_not_reported(
    redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "po_app.py").write_text(APP)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-q"
    side = redis.Redis.from_url(redis_url)
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register(
        queue,
        "parent",
        every="1s",
        overlap="skip",
        pause_after_failures=2,
        template={"task": "po.parent"},
    )
    variables = {"PO_REDIS": redis_url, "PO_PREFIX": prefix, "PO_QUEUE": queue}
    worker, log = celery_worker(tmp_path, "po_app", queue, variables)

    def runs(kind: str) -> list[str]:
        found = [json.loads(r) for r in side.lrange(f"{prefix}:runs", 0, -1)]
        return [ident for each, ident in found if each == kind]

    try:
        with celery_pump(repeat, queue, redis_url):
            wait_until(
                lambda: len(runs("child")) >= 4,
                60,
                "four children run",
                then=lambda: log.read_text(errors="replace")[-3000:],
            )
        parents, children = set(runs("parent")), set(runs("child"))
        wait_until(
            lambda: {e.id for e in repeat.history(queue, "parent")} >= parents,
            15,
            "every parent run reported",
        )
        history = repeat.history(queue, "parent")
        ran = {e.id for e in history if e.status != "skipped"}  # (slots skipped while one ran)
        assert ran == parents  # no child's run among them
        assert not children & {e.id for e in history}
        assert {e.status for e in history} <= {"succeeded", "skipped"}
        registration = repeat.get(queue, "parent")
        assert registration is not None
        assert not registration.paused  # the children's failures are no streak of its
        assert registration.last_status == "succeeded"
        assert "carries the headers of an occurrence of" in log.read_text(errors="replace")
    finally:
        stop(worker)
        side.close()
        repeat.close()
