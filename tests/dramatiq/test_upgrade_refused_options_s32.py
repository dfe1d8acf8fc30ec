"""A schedule file's stamp written by the earlier release (which took `options = { emq_x = 1 }`
in a Dramatiq schedule) vouched for the file under this one, which refuses such options: a
worker of the new release booted over it ("unchanged since its last sync: the file is not
read again") and kept sending `emq_x`, until an unrelated edit of the file (a comment) made
every new worker refuse to boot. The file stamp's format is raised, so the first boot after
the upgrade reads the file and refuses it (found by session 32's upgrade probe).

Real `dramatiq.Worker`s on a `RedisBroker`, the registry on the test server. The earlier
release is simulated by its two differences that matter here: the refusal off (the check the
worker's boot runs, `check_actors`, finds nothing wrong) and the earlier stamp format."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Repeat, file_stamp
from emq_bridge.dramatiq import BootError, RecurringMiddleware
from emq_bridge.dramatiq import schedule as dramatiq_schedule
from emq_bridge.sync import SyncPlan

# The file stamp format of the release before the refusal (session 31's).
EARLIER_FORMAT = 3


def write_file(path: Path, queue: str, comment: str = "") -> None:
    path.write_text(
        f'{comment}source = "ops-file"\nqueue = "{queue}"\n\n'
        '[[schedule]]\nname = "from-file"\ntask = "tick"\nevery = "1h"\n'
        "options = { emq_x = 1 }\n"
    )


def boot(redis_url: str, prefix: str, file: Path, queue: str) -> list[SyncPlan]:
    """Boot (and stop) one worker of the app: actor `tick` on `queue`, the schedule file."""
    broker = RedisBroker(url=redis_url, namespace=f"d{prefix}")
    try:
        middleware = RecurringMiddleware(prefix=prefix, run_pump=False, schedule_file=file)
        broker.add_middleware(middleware)
        dramatiq.actor(lambda: None, broker=broker, actor_name="tick", queue_name=queue)
        worker = dramatiq.Worker(broker, worker_threads=1)
        try:
            worker.start()
        finally:
            worker.stop(timeout=10_000)
        return middleware.plans
    finally:
        broker.close()


def file_read(plans: list[SyncPlan]) -> bool:
    """Whether the boot read the schedule file (its stamp did not hold)."""
    [plan] = [p for p in plans if p.source == "ops-file"]
    return not plan.by_stamp


def test_a_stamp_of_the_earlier_release_does_not_vouch_for_a_file_now_refused(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"q{uuid.uuid4().hex[:10]}"
    file = tmp_path / "schedules.toml"
    write_file(file, queue)

    # The earlier release: the option taken, the file synced and stamped in its format.
    with monkeypatch.context() as earlier:
        earlier.setattr(file_stamp, "FORMAT", EARLIER_FORMAT)

        def took_it(options: Any) -> None:
            return None

        earlier.setattr(dramatiq_schedule, "message_option_error", took_it)
        assert file_read(boot(redis_url, prefix, file, queue))
        stored = Repeat(client, prefix).get(queue, "from-file")
        assert stored is not None and stored.definition.template["options"] == {"emq_x": 1}
        # Its own next boot trusts the stamp: what the upgraded worker met.
        assert not file_read(boot(redis_url, prefix, file, queue))

    # This release, on the same file and registry: the file is read, and refused.
    with (
        caplog.at_level(logging.INFO, logger="emq_bridge"),
        pytest.raises(BootError, match=r"option 'emq_x' is written on each message"),
    ):
        boot(redis_url, prefix, file, queue)
    assert "unchanged since its last sync" not in caplog.text

    # As an unrelated edit made it refuse before the fix: the refusal does not depend on it.
    write_file(file, queue, comment="# edited\n")
    with pytest.raises(BootError, match=r"option 'emq_x' is written on each message"):
        boot(redis_url, prefix, file, queue)
