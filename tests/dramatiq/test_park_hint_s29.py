"""A Dramatiq pump that parks another app's schedule says how apps keep apart (probe: several
apps on one registry).

A Celery app's schedule and a Dramatiq service's actor share a queue name in one registry
(one prefix). The service's pump serves the queue, whichever app declared what is in it, so
it parks the Celery schedule: its task is no actor of the service's broker. The park reason
that `list` and `show` print named only a missing import; it now also says that an app
sharing the registry needs a prefix of its own. Both Dramatiq dispatchers build the message
the same way: each is run, on a real `RedisBroker` on the test server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from click.testing import CliRunner
from dramatiq.brokers.redis import RedisBroker

from emq_bridge import Pump, Repeat
from emq_bridge.cli import cli
from emq_bridge.dramatiq import dramatiq_dispatcher

HINT = (
    "if another app shares this registry (same prefix), give each app its own prefix "
    "(RecurringMiddleware(prefix=...), Celery's emq_bridge_prefix)"
)


@pytest.fixture
def broker(redis_url: str, client: redis.Redis) -> Iterator[RedisBroker]:
    namespace = f"ph{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=namespace)
    yield broker
    broker.close()
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.mark.parametrize("pipelined", [False, True], ids=["enqueue", "pipelined"])
def test_the_park_reason_of_an_actor_the_broker_lacks_names_a_prefix_per_app(
    broker: RedisBroker, repeat: Repeat, redis_url: str, prefix: str, pipelined: bool
) -> None:
    queue = f"reports-{prefix}"
    dramatiq.actor(lambda: None, broker=broker, actor_name="c_refresh", queue_name=queue)
    template = {"task": "shared.report", "args": [], "kwargs": {}, "options": {}}
    repeat.upsert(  # the Celery app's schedule, in a queue of the same name
        queue, "report", every="1h", immediately=True, template=template, source="celery.appa"
    )
    dispatcher = dramatiq_dispatcher(broker, pipelined=pipelined)
    tick = Pump(repeat, [queue], dispatcher).run_once()
    assert tick.parked == ["report"] and tick.dispatched == []

    parked = repeat.get(queue, "report")
    assert parked is not None and parked.parked_reason is not None
    assert parked.parked_reason.startswith("actor 'shared.report' is not declared on this broker")
    assert parked.parked_reason.endswith(HINT)

    base = ["--redis-url", redis_url, "--prefix", prefix]
    shown = CliRunner().invoke(cli, [*base, "show", queue, "report"])
    assert shown.exit_code == 0, shown.output
    assert HINT in " ".join(shown.stdout.split())
    listed = CliRunner().invoke(cli, [*base, "list", queue, "--json"])
    assert listed.exit_code == 0, listed.output
    assert HINT in listed.stdout
