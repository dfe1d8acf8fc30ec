"""A Dramatiq worker whose actors' schedules and schedule file are those of the last sync, with
nothing else written since, reads no record at boot and does not read its file again; any
other writer makes the next boot sync in full. Real `dramatiq.Worker`s on a Redis broker."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Repeat
from emq_bridge.dramatiq import BootError, RecurringMiddleware, recurring
from emq_bridge.sync import SyncPlan


class Workers:
    """Boots a worker of one app (actor `tick` with an hourly schedule, a schedule file)."""

    def __init__(self, redis_url: str, prefix: str, file: Path) -> None:
        self.redis_url, self.prefix, self.file = redis_url, prefix, file
        self.queue = f"q{uuid.uuid4().hex[:10]}"
        self.started: list[tuple[dramatiq.Worker, dramatiq.Broker]] = []

    def write_file(self, every: str) -> None:
        self.file.write_text(
            f'source = "ops-file"\nqueue = "{self.queue}"\n\n'
            f'[[schedule]]\nname = "from-file"\ntask = "tick"\nevery = "{every}"\n'
        )

    def boot(
        self, actor_queue: str | None = None, schedule: str = "hourly", **options: Any
    ) -> list[SyncPlan]:
        broker = RedisBroker(url=self.redis_url, namespace=f"d{self.prefix}")
        middleware = RecurringMiddleware(
            prefix=self.prefix, run_pump=False, schedule_file=self.file, **options
        )
        broker.add_middleware(middleware)
        actor: Any = dramatiq.actor(
            lambda: None, broker=broker, actor_name="tick", queue_name=actor_queue or self.queue
        )
        recurring(every="1h", name=schedule)(actor)
        worker = dramatiq.Worker(broker, worker_threads=1)
        worker.start()
        self.started.append((worker, broker))
        worker.stop(timeout=10_000)
        return middleware.plans

    def close(self) -> None:
        for _, broker in self.started:
            broker.close()


@pytest.fixture
def workers(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Workers]:
    built = Workers(redis_url, prefix, tmp_path / "schedules.toml")
    built.write_file("1h")
    yield built
    built.close()


def by_stamp(plans: list[SyncPlan]) -> dict[str, bool]:
    return {plan.source: plan.by_stamp for plan in plans}


def test_an_unchanged_worker_boot_reads_no_record_and_not_its_file(
    workers: Workers, client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert by_stamp(workers.boot()) == {"dramatiq": False, "ops-file": False}
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        plans = workers.boot()

    assert by_stamp(plans) == {"dramatiq": True, "ops-file": True}
    assert [d.name for d in plans[0].unchanged] == ["hourly"]
    # The file's plan has no declarations (it was not read) but says how many it vouches for:
    # `emq-bridge pump --dramatiq` printed "0 unchanged" for it.
    assert [plan.unchanged_count for plan in plans] == [1, 1]
    assert "ops-file unchanged since its last sync (1 schedule(s))" in caplog.text
    assert "its stamp holds: nothing read" in caplog.text
    repeat = Repeat(client, prefix)
    assert {r.name: r.source for r in repeat.list(workers.queue)} == {
        "hourly": "dramatiq",
        "from-file": "ops-file",
    }


def test_a_changed_file_or_another_writer_makes_the_next_boot_sync_in_full(
    workers: Workers, client: redis.Redis, prefix: str
) -> None:
    workers.boot()
    workers.write_file("2h")

    assert by_stamp(workers.boot()) == {"dramatiq": True, "ops-file": False}
    repeat = Repeat(client, prefix)
    changed = repeat.get(workers.queue, "from-file")
    assert changed is not None and changed.definition.cadence.describe() == "every 2h"

    repeat.cancel(workers.queue, "hourly")  # by hand
    plans = workers.boot()
    assert by_stamp(plans) == {"dramatiq": False, "ops-file": True}
    assert [d.name for d in plans[0].create] == ["hourly"]
    assert by_stamp(workers.boot()) == {"dramatiq": True, "ops-file": True}


def test_an_actor_moved_to_another_queue_checks_the_file_again(workers: Workers) -> None:
    workers.boot()
    elsewhere = f"{workers.queue}-2"
    with pytest.raises(BootError, match="consumes queue"):  # the file's queue is no longer its
        workers.boot(actor_queue=elsewhere)


def test_without_reports_the_file_is_read_at_every_boot(workers: Workers) -> None:
    workers.boot(report=False)
    assert by_stamp(workers.boot(report=False)) == {"dramatiq": True, "ops-file": False}
    assert by_stamp(workers.boot(prune=False)) == {"dramatiq": False, "ops-file": False}


def test_a_file_declaring_an_actors_own_schedule_name_stops_the_boot(
    workers: Workers, client: redis.Redis, prefix: str
) -> None:
    # Synced one after the other, each source would take "hourly" from the other at every
    # boot (the cadence following whichever ran last): refused before any write.
    workers.file.write_text(
        f'source = "ops-file"\nqueue = "{workers.queue}"\n\n'
        '[[schedule]]\nname = "hourly"\ntask = "tick"\nevery = "10s"\n'
    )
    with pytest.raises(BootError, match=r"hourly is declared by both dramatiq and ops-file"):
        workers.boot()
    assert Repeat(client, prefix).names(workers.queue) == []


def test_an_actor_taking_the_name_of_an_unchanged_files_schedule_stops_the_boot(
    workers: Workers, client: redis.Redis, prefix: str
) -> None:
    # The file's stamp holds, so the file is not read: its names are checked in the registry
    # instead, before any write (the actor's sync took "from-file" from the file, and the
    # next boot, reading the file again, refused the pair).
    workers.boot()
    with pytest.raises(BootError, match=r"from-file is declared by both ops-file and dramatiq"):
        workers.boot(schedule="from-file")
    repeat = Repeat(client, prefix)
    assert {r.name: r.source for r in repeat.list(workers.queue)} == {
        "hourly": "dramatiq",
        "from-file": "ops-file",
    }
    kept = repeat.get(workers.queue, "from-file")
    assert kept is not None and kept.definition.cadence.describe() == "every 1h"
    assert by_stamp(workers.boot()) == {"dramatiq": True, "ops-file": True}
