"""Who owns which schedule, with real `celery beat` and `celery worker` processes.

The app's schedules belong to the beat, whose sync alone removes what the app no longer
declares (`beat_schedule` under `celery.<main>`, the `@recurring` tasks under
`celery.<main>.recurring`, of the tasks it knows); a worker upserts its `@recurring` tasks and
never touches `beat_schedule`. With `emq_bridge_generation`, an older version of the app
booting during a rolling deploy writes nothing. Each test runs one generated app in two
versions against the suite's server, under its own prefix and queue:

* version 1: `beat_schedule` x (every 1 s) and y (every 2 s); `@recurring` own.hourly (1 h)
  and own.v1only (1 h);
* version 2: x removed, y every 3 s; own.hourly every 2 h, own.v1only's decorator removed (the
  task kept), own.v2only (1 h) added;
* version "none": no `beat_schedule` at all (a worker-only config), own.hourly every 2 h.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from emq_bridge import Repeat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import os

    from celery import Celery
    from emq_bridge.celery import recurring

    env = os.environ
    VERSION = env["OWN_VERSION"]
    app = Celery("own", broker=env["OWN_REDIS"])
    app.conf.update(
        emq_bridge_redis_url=env["OWN_REDIS"],
        emq_bridge_prefix=env["OWN_PREFIX"],
        task_default_queue=env["OWN_QUEUE"],
        timezone="UTC",
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
    )
    if env.get("OWN_GENERATION"):
        app.conf.emq_bridge_generation = int(env["OWN_GENERATION"])
    BEAT = {
        "1": {
            "x": {"task": "own.record", "schedule": 1.0, "args": ["x"]},
            "y": {"task": "own.record", "schedule": 2.0, "args": ["y"]},
        },
        "2": {"y": {"task": "own.record", "schedule": 3.0, "args": ["y"]}},
    }
    if VERSION in BEAT:
        app.conf.beat_schedule = BEAT[VERSION]


    @app.task(name="own.record")
    def record(label):
        return label


    @recurring(every="1h" if VERSION == "1" else "2h")
    @app.task(name="own.hourly")
    def hourly():
        return None


    if VERSION == "1":

        @recurring(every="1h")
        @app.task(name="own.v1only")
        def v1only():
            return None

    if VERSION == "2":

        @app.task(name="own.v1only")  # its decorator removed, the task kept
        def v1only():
            return None

        @recurring(every="1h")
        @app.task(name="own.v2only")
        def v2only():
            return None
""")

SOURCE = "celery.own"
TASKS = "celery.own.recurring"  # the @recurring tasks' source
# What version 2 declares: name -> (cadence, owner).
VERSION_2 = {
    "y": ("every 3s", SOURCE),
    "own.hourly": ("every 2h", TASKS),
    "own.v2only": ("every 1h", TASKS),
}


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Deploy:
    """`celery beat` and `celery worker` processes of the app, in either version."""

    def __init__(self, root: Path, redis_url: str) -> None:
        self.root = root
        self.prefix = f"t{uuid.uuid4().hex[:10]}"
        self.queue = f"{self.prefix}-q"
        self.redis_url = redis_url
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.client = redis.Redis.from_url(redis_url)
        self.repeat = Repeat(self.client, self.prefix)
        (root / "own_app.py").write_text(APP)

    def start(self, kind: str, version: str, generation: int | None = None) -> Process:
        log = self.root / f"{kind}-{version}-{len(self.procs)}.log"
        beat = ["beat", "-S", "emq", "--pidfile=", f"--schedule={log.with_suffix('.db')}"]
        worker = ["worker", "-P", "solo", "-c", "1", "-n", f"w{len(self.procs)}@%h"]
        worker += ["-Q", self.queue, "--without-mingle", "--without-gossip", "--without-heartbeat"]
        args = beat if kind == "beat" else worker
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(self.root), os.environ.get("PYTHONPATH", "")]),
            "OWN_REDIS": self.redis_url,
            "OWN_PREFIX": self.prefix,
            "OWN_QUEUE": self.queue,
            "OWN_VERSION": version,
            "OWN_GENERATION": "" if generation is None else str(generation),
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "own_app", *args, "-l", "info"],
                cwd=self.root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log))
        return Process(proc, log)

    def boot(self, kind: str, version: str, generation: int | None = None) -> Process:
        """Start a process and wait until its sync is done (a worker syncs before it is ready)."""
        process = self.start(kind, version, generation)
        done = r"@\S+ ready\." if kind == "worker" else r"schedule\(s\) declared"
        wait_for(lambda: re.search(done, process.log()) is not None, 30, f"{kind} {version} sync")
        return process

    def schedules(self) -> dict[str, tuple[str, str | None, int | None]]:
        """Return name -> (cadence, owner, updated_ms) for the app's queue."""
        return {
            r.name: (r.definition.cadence.describe(), r.source, r.updated_ms)
            for r in self.repeat.list(self.queue)
        }

    def definitions(self) -> dict[str, tuple[str, str | None]]:
        return {name: (cadence, owner) for name, (cadence, owner, _) in self.schedules().items()}

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.client.delete(self.queue)  # the tasks the beats sent
        self.client.close()


class Process:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.path = log

    def log(self) -> str:
        return self.path.read_text(errors="replace")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log()


@pytest.fixture
def deploy(tmp_path: Path, redis_url: str) -> Iterator[Deploy]:
    deploy = Deploy(tmp_path, redis_url)
    try:
        yield deploy
    finally:
        deploy.close()


def test_an_old_worker_booting_under_a_new_beat_neither_recreates_nor_reverts_its_entries(
    deploy: Deploy,
) -> None:
    deploy.boot("beat", "1").stop()
    assert deploy.definitions()["x"] == ("every 1s", SOURCE)
    beat = deploy.boot("beat", "2")
    assert "x" not in deploy.definitions()
    assert deploy.definitions()["y"] == ("every 3s", SOURCE)
    worker = deploy.boot("worker", "1")
    after_worker = beat.log().count("Sending due task y (")
    # The beat wakes on any registry change, so a re-created x would be sent within a second;
    # two more sends of y (3 s apart) show the beat kept running on what it synced.
    wait_for(
        lambda: beat.log().count("Sending due task y (") >= after_worker + 2, 15, "two y sends"
    )
    worker.stop()
    definitions = deploy.definitions()
    assert "x" not in definitions, worker.log()[-3000:]
    assert definitions["y"] == ("every 3s", SOURCE)
    assert "own.v2only" in definitions  # the old worker removes nothing, not even a task
    assert "Sending due task x (" not in beat.log()


def test_a_worker_whose_config_has_no_beat_schedule_deletes_no_beat_entry(deploy: Deploy) -> None:
    deploy.boot("beat", "1").stop()
    before = deploy.schedules()
    assert {"x", "y"} <= before.keys()
    worker = deploy.boot("worker", "none")
    worker.stop()
    after = deploy.schedules()
    assert {k: after.get(k) for k in "xy"} == {k: before[k] for k in "xy"}, worker.log()[-3000:]


def test_versions_booting_in_alternation_with_generations_never_flip_a_schedule(
    deploy: Deploy,
) -> None:
    deploy.boot("beat", "1", generation=1).stop()
    assert deploy.definitions()["x"] == ("every 1s", SOURCE)
    # Version 2's beat keeps running while both versions boot, as in a rolling deploy.
    beat = deploy.boot("beat", "2", generation=2)
    live = deploy.schedules()
    assert deploy.definitions() == VERSION_2
    for kind, version, generation in [
        ("worker", "1", 1),
        ("worker", "2", 2),
        ("beat", "1", 1),
        ("worker", "1", 1),
        ("beat", "2", 2),
        ("worker", "1", 1),
    ]:
        output = deploy.boot(kind, version, generation).stop()
        # Nothing was rewritten: the same definitions, owners and `updated_ms`.
        assert deploy.schedules() == live, f"after {kind} {version}:\n{output[-3000:]}"
        if version == "1":
            assert re.search(r"WARNING.*generation 1 refused, a newer generation \(2\)", output)
    assert beat.proc.poll() is None
    assert "Sending due task x (" not in beat.log()


def test_a_worker_logs_what_its_sync_changes_at_warning_once_logging_is_up_and_prunes_its_tasks(
    deploy: Deploy,
) -> None:
    first = deploy.boot("worker", "1").stop()
    assert re.search(rf"INFO/MainProcess\] sync {TASKS}: \+ {deploy.queue}/own.hourly", first)
    second = deploy.boot("worker", "2").stop()
    assert re.search(
        rf"WARNING/MainProcess\] sync {TASKS}: ~ {deploy.queue}/own.hourly  "
        r"every 1h -> every 2h",
        second,
    ), second[-3000:]
    # Version 2 knows own.v1only without its decorator: its worker removes the schedule.
    assert re.search(
        rf"WARNING/MainProcess\] sync {TASKS}: - {deploy.queue}/own.v1only  \(was every 1h\)",
        second,
    ), second[-3000:]
    assert "own.v1only" not in deploy.definitions()
    beat = deploy.boot("beat", "2").stop()  # nothing left for it to remove
    assert f"sync {TASKS}: 0 created, 0 updated, 2 unchanged, 0 removed" in beat, beat[-3000:]
    assert f"sync {SOURCE}: 1 created, 0 updated, 0 unchanged, 0 removed" in beat, beat[-3000:]
    # On an unchanged registry: the summary line only (unchanged schedules are DEBUG lines).
    third = deploy.boot("worker", "2").stop()
    assert f"sync {TASKS}: 0 created, 0 updated, 2 unchanged, 0 removed" in third
    assert not re.search(rf"sync {TASKS}: [-+~=] ", third), third[-3000:]


def test_an_unchanged_beat_restart_skips_its_sync_until_another_process_writes_its_schedules(
    deploy: Deploy,
) -> None:
    deploy.boot("beat", "1").stop()
    live = deploy.schedules()
    again = deploy.boot("beat", "1")
    wait_for(lambda: "Sending due task x (" in again.log(), 15, "x sent by the restarted beat")
    output = again.stop()
    assert "celery.own unchanged since its last sync (4 schedule(s))" in output, output[-3000:]
    assert "created" not in output and deploy.schedules().keys() == live.keys()

    deploy.repeat.cancel(deploy.queue, "y")  # by hand: the next boot syncs in full
    third = deploy.boot("beat", "1").stop()
    assert "unchanged since" not in third
    assert f"sync {SOURCE}: 1 created, 0 updated, 1 unchanged, 0 removed" in third, third[-3000:]
    assert deploy.definitions()["y"] == ("every 2s", SOURCE)

    # A worker of another version changes a decorated task: the beat's next boot reverts it.
    deploy.boot("worker", "2").stop()
    assert deploy.definitions()["own.hourly"] == ("every 2h", TASKS)
    fourth = deploy.boot("beat", "1").stop()
    assert "unchanged since" not in fourth
    assert deploy.definitions()["own.hourly"] == ("every 1h", TASKS)
    # own.v2only's task is not one version 1 knows: its beat cannot tell it was dropped.
    assert deploy.definitions()["own.v2only"] == ("every 1h", TASKS)
    assert f"sync {TASKS}: kept {deploy.queue}/own.v2only: its task own.v2only" in fourth
    assert "unchanged since" in deploy.boot("beat", "1").stop()
