"""A copy of a running guarded occurrence that Dramatiq's `AgeLimit` skips before it starts
(found by a probe on RabbitMQ, whose redelivery of a dropped consumer's message comes back
aged): it was reported `skipped` for the same attempt, which ended the running entry, so
the history read `skipped` for a run that went on and succeeded, and `overlap="skip"` let
the next slot start beside it. Now a copy that never reached its task leaves the attempt
running elsewhere as it is."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from test_dramatiq_lifecycle import (
    HEARTBEAT_S,
    SLOW_S,
    App,
    notes,
    running_group,
    runs,
    wait_for,
)

from emq_bridge import HistoryEntry, Repeat


@pytest.fixture(scope="module")
def aged(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[App, Repeat, redis.Redis]]:
    yield from running_group(tmp_path_factory, redis_url, "aged", processes=2, threads=4)


def _send_aged_copy(redis_url: str, app: App, options: dict[str, object], ident: str) -> None:
    """Enqueue a copy of occurrence `ident` stamped a minute old: `AgeLimit` skips it."""
    broker = RedisBroker(url=redis_url, namespace=app.namespace)
    try:
        dramatiq.actor(broker=broker, queue_name=app.queue, actor_name="aged_slow")(lambda: None)
        broker.enqueue(
            dramatiq.Message(
                queue_name=app.queue,
                actor_name="aged_slow",
                args=(),
                kwargs={},
                options={k: v for k, v in options.items() if k != "redis_message_id"},
                message_id=ident,
                message_timestamp=int(time.time() * 1000) - 60_000,
            )
        )
    finally:
        broker.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_aged_copy_skipped_before_its_start_leaves_the_run_in_flight(
    aged: tuple[App, Repeat, redis.Redis], redis_url: str
) -> None:
    app, repeat, client = aged

    def just_started() -> HistoryEntry | None:
        now_ms = repeat.server_time_ms()
        history = repeat.history(app.queue, "aged_slow")
        return next(
            (e for e in history if e.status == "running" and now_ms - (e.started_ms or 0) < 500),
            None,
        )

    running = wait_for(just_started, app, what="a run of aged_slow that just started")
    [seen] = wait_for(
        lambda: [n for n in notes(client, app, "aged_slow") if n["id"] == running.id], app
    )
    _send_aged_copy(redis_url, app, seen["options"], running.id)
    time.sleep(1.0)  # the copy is skipped well before the run ends (SLOW_S)
    [entry] = [e for e in repeat.history(app.queue, "aged_slow") if e.id == running.id]
    assert entry.status == "running", entry

    def ended() -> HistoryEntry | None:
        return next(
            (
                e
                for e in repeat.history(app.queue, "aged_slow")
                if e.id == running.id and e.status == "succeeded"
            ),
            None,
        )

    done = wait_for(ended, app, what="the run's end")
    assert (done.duration_ms or 0) >= SLOW_S * 1000 - 100
    time.sleep(3 * HEARTBEAT_S + 1)
    # No two runs overlapped (skip), the copy ran nowhere, and it counted no skip of its own.
    finished = runs(repeat.history(app.queue, "aged_slow"))
    for before, after in itertools.pairwise(finished):
        assert (after.started_ms or 0) >= (before.finished_ms or 0), (before, after)
    assert [n["id"] for n in notes(client, app, "aged_slow")].count(running.id) == 1
    output = app.logs()
    assert "Unexpected failure" not in output, output[-3000:]
