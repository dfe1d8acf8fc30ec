"""Rolling deploys: two versions of one app's declarations, booting in turn, never flip-flop.

Real `dramatiq` worker processes of a generated app in two versions, with
`RecurringMiddleware(generation=...)`, against the suite's server under a per-test prefix;
and the registry-level race behind it: two syncs of generations 1 and 2 racing in threads
always end on generation 2's definitions (the guard is inside the writing scripts).

* version 1 (generation 1): `report` every 1 min, `v1only` every 1 min;
* version 2 (generation 2): `report` every 2 min, `v2only` every 1 min.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from emq_bridge import Repeat, define
from emq_bridge.definition import Declaration
from emq_bridge.registry import StaleGeneration
from emq_bridge.sync import sync

pytestmark = [pytest.mark.timeout(120)]

APP = """
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from emq_bridge.dramatiq import RecurringMiddleware, recurring

env = os.environ
VERSION = env["OWN_VERSION"]
broker = RedisBroker(url=env["REDIS_URL"], namespace=env["OWN_NAMESPACE"])
broker.add_middleware(
    RecurringMiddleware(
        prefix=env["OWN_PREFIX"],
        source="own",
        generation=int(env["OWN_GENERATION"]) if env.get("OWN_GENERATION") else None,
        run_pump=False,
    )
)
dramatiq.set_broker(broker)
QUEUE = env["OWN_QUEUE"]


@recurring(every="1m" if VERSION == "1" else "2m")
@dramatiq.actor(queue_name=QUEUE)
def report():
    return None


@recurring(every="1m", name="v1only" if VERSION == "1" else "v2only")
@dramatiq.actor(queue_name=QUEUE)
def other():
    return None
"""

VERSION_2 = {"report": "every 2m", "v2only": "every 1m"}


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Deploy:
    """`dramatiq` commands running the app in either version, one worker process each."""

    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        token = uuid.uuid4().hex[:10]
        self.root = root
        self.module = f"emq_own_app_{token}"
        self.queue = f"q{token}"
        self.repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
        (root / f"{self.module}.py").write_text(APP)
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "OWN_PREFIX": prefix,
            "OWN_NAMESPACE": f"dq{token}",
            "OWN_QUEUE": self.queue,
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        }
        self.running: list[subprocess.Popen[bytes]] = []

    def boot(self, version: str, generation: int) -> str:
        """Run one worker of `version` until its sync is done; stop it; return its output."""
        log = self.root / f"{uuid.uuid4().hex[:8]}.log"
        command = [sys.executable, "-m", "dramatiq", self.module, "--path", str(self.root)]
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [*command, "--processes", "1", "--threads", "1"],
                env={**self.env, "OWN_VERSION": version, "OWN_GENERATION": str(generation)},
                cwd=self.root,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        self.running.append(process)
        try:
            wait_for(
                lambda: (
                    "sync own: " in log.read_text(errors="replace")
                    and " removed" in log.read_text(errors="replace")
                ),
                30,
                f"the sync of version {version}",
            )
        finally:
            self.stop(process)
        return log.read_text(errors="replace")

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def schedules(self) -> dict[str, tuple[str, int | None]]:
        return {
            r.name: (r.definition.cadence.describe(), r.updated_ms)
            for r in self.repeat.list(self.queue)
        }

    def close(self) -> None:
        for process in self.running:
            self.stop(process)
        self.repeat.close()


@pytest.fixture
def deploy(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Deploy]:
    deploy = Deploy(tmp_path, redis_url, prefix)
    try:
        yield deploy
    finally:
        deploy.close()


def test_workers_of_two_versions_booting_in_alternation_keep_the_newer_schedules(
    deploy: Deploy,
) -> None:
    first = deploy.boot("1", generation=1)
    assert {n: c for n, (c, _) in deploy.schedules().items()} == {
        "report": "every 1m",
        "v1only": "every 1m",
    }, first[-3000:]
    deploy.boot("2", generation=2)
    live = deploy.schedules()
    assert {n: c for n, (c, _) in live.items()} == VERSION_2
    for version, generation in [("1", 1), ("2", 2), ("1", 1), ("1", 1), ("2", 2)]:
        output = deploy.boot(version, generation)
        # Nothing was rewritten: the same definitions and `updated_ms`.
        assert deploy.schedules() == live, output[-3000:]
        if version == "1":
            refused = re.findall(r"\[WARNING\] sync own: generation 1 refused", output)
            assert len(refused) == 1, output[-3000:]


def test_a_worker_booting_on_an_unchanged_registry_logs_no_line_per_schedule(
    deploy: Deploy,
) -> None:
    deploy.boot("2", generation=2)
    output = deploy.boot("2", generation=2)
    assert "sync own: 0 created, 0 updated, 2 unchanged, 0 removed" in output, output[-3000:]
    assert not re.search(r"sync own: [-+~=] ", output), output[-3000:]


def _version(queues: list[str], every: str, only: str) -> list[Declaration]:
    """The declarations of one version: 60 shared names per queue, and 60 of its own."""
    return [
        Declaration(queue, f"{stem}{i}", define(every=every, template={"task": f"t.{stem}"}))
        for queue in queues
        for stem in ("shared", only)
        for i in range(60)
    ]


def _race(
    repeat: Repeat,
    declarations: list[Declaration],
    generation: int,
    times: int,
    start: threading.Barrier,
    errors: list[BaseException],
    delay_s: float,
) -> None:
    """Sync `declarations` `times` times once both threads are ready, `delay_s` apart."""
    try:
        start.wait(timeout=10)
        for _ in range(times):
            time.sleep(delay_s * generation)
            sync(repeat, declarations, "app", generation=generation)
    except BaseException as exc:  # reported by the test, not lost in the thread
        errors.append(exc)


def test_two_syncs_of_generations_1_and_2_racing_always_end_on_generation_2(
    redis_url: str, prefix: str
) -> None:
    version_1 = _version([f"{prefix}-a", f"{prefix}-b"], "1m", "old")
    version_2 = _version([f"{prefix}-a", f"{prefix}-b"], "2m", "new")
    wanted = {(d.queue, d.name): d.definition.cadence for d in version_2}
    rng = random.Random(12)
    for round_ in range(16):
        repeats = [Repeat(redis.Redis.from_url(redis_url), f"{prefix}r{round_}") for _ in "12"]
        if round_ % 2:  # half the rounds start from version 1 live, the rest from nothing
            sync(repeats[0], version_1, "app", generation=1)
        start = threading.Barrier(2)
        errors: list[BaseException] = []
        common = (start, errors, rng.random() / 200)
        threads = [
            threading.Thread(target=_race, args=(repeats[0], version_1, 1, 3, *common)),
            threading.Thread(target=_race, args=(repeats[1], version_2, 2, 1, *common)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        found = {
            (q, r.name): r.definition.cadence
            for q in (f"{prefix}-a", f"{prefix}-b")
            for r in repeats[0].list(q)
        }
        assert found == wanted, f"round {round_}"
        assert sync(repeats[0], version_1, "app", generation=1).refused_by == 2
        assert repeats[0].generations(f"{prefix}-a") == {"app": 2}
        for repeat in repeats:
            repeat.close()


def test_an_older_generation_is_refused_by_the_writing_scripts_themselves(
    repeat: Repeat, prefix: str
) -> None:
    queue = f"{prefix}-q"
    definition = define(every="1m", template={"task": "t"})
    repeat.upsert_many([(queue, "a", definition)], source="app", generation=2)
    with pytest.raises(StaleGeneration) as refused:
        repeat.upsert_many([(queue, "a", define(every="2m"))], source="app", generation=1)
    assert (refused.value.queue, refused.value.live, refused.value.generation) == (queue, 2, 1)
    with pytest.raises(StaleGeneration):
        repeat.cancel(queue, "a", if_source="app", generation=1)
    registration = repeat.get(queue, "a")
    assert registration is not None and registration.definition == definition
    # Equal or newer applies; another source's generation is its own.
    assert repeat.cancel(queue, "a", if_source="app", generation=2) is True
    repeat.upsert_many([(queue, "b", definition)], source="other", generation=1)
    assert repeat.generations(queue) == {"app": 2, "other": 1}
