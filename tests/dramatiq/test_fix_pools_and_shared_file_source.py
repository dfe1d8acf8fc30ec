"""Worker boots that share a source: (1) two pools of one app, one importing fewer actor
modules, no longer share a boot stamp, so the pool that knows a decorator was removed prunes
it; (2) two apps whose schedule files have the same default source (`file:schedules.toml`)
no longer delete each other's file schedules at every boot. Real `dramatiq.Worker`s on a
Redis broker.

Before: the smaller pool's stamp was taken by the larger pool as its own, so a removed
decorator's schedule stayed (and was sent) for good; a file's sync pruned every schedule of
its source, whatever broker's actors they named.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import RecurringMiddleware, recurring


class Boots:
    def __init__(self, redis_url: str, prefix: str) -> None:
        self.redis_url, self.prefix = redis_url, prefix
        self.brokers: list[dramatiq.Broker] = []

    def boot(self, actors: dict[str, tuple[str, str | None]], **options: Any) -> None:
        """Boot a worker whose actors are `name -> (queue, schedule name or None)`."""
        broker = RedisBroker(url=self.redis_url, namespace=f"d{uuid.uuid4().hex[:8]}")
        broker.add_middleware(RecurringMiddleware(prefix=self.prefix, run_pump=False, **options))
        for actor_name, (queue, schedule) in actors.items():
            actor: Any = dramatiq.actor(
                lambda: None, broker=broker, actor_name=actor_name, queue_name=queue
            )
            if schedule is not None:
                recurring(every="1h", name=schedule)(actor)
        worker = dramatiq.Worker(broker, worker_threads=1)
        worker.start()
        worker.stop(timeout=10_000)
        self.brokers.append(broker)


@pytest.fixture
def boots(redis_url: str, prefix: str) -> Iterator[Boots]:
    made = Boots(redis_url, prefix)
    yield made
    for broker in made.brokers:
        broker.close()


def test_a_pool_that_knows_a_removed_decorator_prunes_it(boots: Boots, repeat: Repeat) -> None:
    q1, q2 = f"p{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:8]}"
    pool_x_old = {"a1": (q1, "r1"), "a2": (q2, "r2")}
    pool_x_new: dict[str, tuple[str, str | None]] = {"a1": (q1, "r1"), "a2": (q2, None)}
    pool_y = {"a1": (q1, "r1")}
    boots.boot(pool_x_old, source="pool")
    boots.boot(pool_y, source="pool")  # the new code, on a pool without a2's module
    assert repeat.names(q2) == ["r2"]  # not its actor: left alone
    boots.boot(pool_x_new, source="pool")  # the new code, on the pool that has a2
    assert repeat.names(q2) == []
    assert repeat.names(q1) == ["r1"]


def test_two_apps_files_of_one_default_source_keep_each_others(
    boots: Boots, repeat: Repeat, tmp_path: Path
) -> None:
    queue = f"s{uuid.uuid4().hex[:8]}"

    def app(letter: str) -> Callable[[], None]:
        folder = tmp_path / letter
        folder.mkdir()
        file = folder / "schedules.toml"  # the same base name: source "file:schedules.toml"
        file.write_text(
            f'queue = "{queue}"\n\n[[schedule]]\nname = "{letter}_file_job"\n'
            f'task = "{letter}_task"\nevery = "45m"\n'
        )
        return lambda: boots.boot(
            {f"{letter}_task": (queue, None)}, source=f"app-{letter}", schedule_file=file
        )

    boot_a, boot_b = app("a"), app("b")
    boot_a()
    boot_b()
    boot_a()
    assert sorted(repeat.names(queue)) == ["a_file_job", "b_file_job"]
