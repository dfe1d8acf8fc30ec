"""`celery worker -B -S emq` is told, in one WARNING, that it runs Celery's own scheduler
(probe: worker pools, session 31).

On `celery worker`, `-S` is `--statedb`: the embedded beat runs the `beat_scheduler` default,
`PersistentScheduler`, from `beat_schedule`, with a state file named `emq`. docs/celery.md
said so, but the worker did not: its schedules fired from that scheduler besides any beat
that runs `-S emq`, a slot sent twice. `--scheduler emq` gets no warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import stop, wait_until

from emq_bridge.celery.worker_beat import mistyped_scheduler

APP = textwrap.dedent("""
    import os

    from celery import Celery

    import emq_bridge.celery

    env = os.environ
    app = Celery("wbapp", broker=env["WB_BROKER"])
    app.conf.update(
        emq_bridge_prefix=env["WB_PREFIX"],
        task_default_queue=env["WB_QUEUE"],
        result_backend=None,
        broker_connection_retry_on_startup=True,
        beat_schedule={"tick": {"task": "wb.tick", "schedule": 1.0}},
    )


    @app.task(name="wb.tick")
    def tick():
        return None
""")

WARNING = "this worker's embedded beat (-B) runs celery.beat:PersistentScheduler"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("option", "warned"), [("-S", True), ("--scheduler", False)], ids=["statedb", "scheduler"]
)
def test_worker_b_with_s_emq_warns_that_celerys_scheduler_runs(
    tmp_path: Path, redis_url: str, prefix: str, option: str, warned: bool
) -> None:
    (tmp_path / "wbapp.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
        WB_BROKER=redis_url,
        WB_PREFIX=prefix,
        WB_QUEUE=f"{prefix}-q",
    )
    argv = [sys.executable, "-m", "celery", "-A", "wbapp", "worker", "-B", option, "emq"]
    argv += ["-P", "solo", "-Q", f"{prefix}-q", "-l", "info", "--without-mingle"]
    argv += ["--without-gossip", "--without-heartbeat"]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)

    def said() -> str:
        return log.read_text(errors="replace")

    try:
        # The warning comes as the worker is set up (`celeryd_after_setup`), before it is ready.
        wait_until(lambda: " ready." in said(), 60, "the worker ready", then=said)
    finally:
        stop(worker)
    assert (WARNING in said()) is warned, said()
    if warned:
        assert "Spell it `--scheduler emq`" in said()


def test_only_a_state_file_named_as_the_scheduler_is_taken_for_the_mistake() -> None:
    persistent = "celery.beat:PersistentScheduler"
    assert mistyped_scheduler("emq", persistent) is not None
    assert mistyped_scheduler("/var/run/emq_bridge.celery:RepeatScheduler", persistent)
    assert mistyped_scheduler("emq", "emq") is None
    assert mistyped_scheduler("emq", "emq_bridge.celery:RepeatScheduler") is None
    assert mistyped_scheduler("worker.db", persistent) is None
    assert mistyped_scheduler(None, persistent) is None
