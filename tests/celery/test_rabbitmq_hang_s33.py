"""A RabbitMQ that hangs or refuses, met by the Celery dispatcher (found by a probe with a
fault proxy in front of RabbitMQ, session 33).

* A broker that stops answering (black-holed: no reply, no reset) held `celery beat -S emq`
  inside one `apply_async` for as long as it hung, sending nothing on any queue and saying
  nothing: py-amqp waits for a publish's confirm with no bound unless given one. A publish to
  RabbitMQ now waits at most `AMQP_SEND_TIMEOUT_S` for the socket and as long for the confirm
  (kombu's retry policy may try a few times), and a send that found the broker unreachable
  (`BrokerUnreachable`) is not followed by the rest of its batch: they fail untried, their
  leases kept, sent again when the leases expire.
* A publish RabbitMQ refused (a nack, with `confirm_publish`) was logged as
  "sending ... failed: " and nothing more (`MessageNacked` has no text): the error's type is
  in the line now.
* A beat on RabbitMQ without `confirm_publish` counted what RabbitMQ refused as sent, with no
  warning (the Dramatiq dispatcher warns of `confirm_delivery=False`): it warns at its first
  send now.

Real RabbitMQ (127.0.0.1:5672), behind a loopback proxy that can stop forwarding.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest
from blackhole_proxy import BlackholeProxy
from celery import Celery
from kombu import Queue

from emq_bridge import BrokerUnreachable, DispatchError, Pump
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.testing import RecordingDispatcher, fake_repeat


def rabbit_app(url: str, **conf: Any) -> Celery:
    app = Celery(f"hang-{uuid.uuid4().hex[:6]}", broker=url)
    app.conf.update(conf)

    @app.task(name=f"{app.main}.t")
    def t() -> None: ...

    return app


def test_a_hung_rabbitmq_fails_the_send_in_bounded_time_and_the_rest_untried(
    rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"emq-hang-{uuid.uuid4().hex[:8]}"
    with BlackholeProxy(5672) as proxy:
        url = rabbitmq_url.replace(":5672", f":{proxy.port}")
        app = rabbit_app(url, broker_transport_options={"confirm_publish": True})
        repeat = fake_repeat()
        for name in ("a", "b", "c"):
            repeat.register(queue, name, every="1h", template={"task": f"{app.main}.t"})
        pump = Pump(repeat, [queue], CeleryDispatcher(app))
        repeat.trigger(queue, "a")
        assert len(pump.run_once().dispatched) == 1  # the connection is up

        proxy.blackhole()
        for name in ("a", "b", "c"):
            repeat.trigger(queue, name)
        ticks: list[Any] = []
        worker = threading.Thread(target=lambda: ticks.append(pump.run_once()), daemon=True)
        with caplog.at_level(logging.ERROR, logger="emq_bridge.pump"):
            worker.start()
            worker.join(120)  # before: it never returned while the broker hung
        assert not worker.is_alive(), "the send is still blocked on the hung broker"
        [tick] = ticks
        assert tick.dispatched == [] and len(tick.failed) == 3
        lines = [
            r.getMessage() for r in caplog.records if "dispatch of occurrence" in r.getMessage()
        ]
        assert len(lines) == 3 and sum("not tried, the broker unreachable" in x for x in lines) == 2
        assert len(repeat.leases(queue)) == 3  # kept: sent again when they expire
    with rabbit_app(rabbitmq_url).connection_for_write() as connection:  # not through the proxy
        Queue(queue).bind(connection.default_channel).delete()


def test_a_refused_publish_names_the_error_and_an_unconfirmed_broker_warns(
    rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"emq-full-{uuid.uuid4().hex[:8]}"
    full = Queue(name, queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    unconfirmed = rabbit_app(rabbitmq_url, task_queues=[full])
    app = rabbit_app(
        rabbitmq_url, broker_transport_options={"confirm_publish": True}, task_queues=[full]
    )
    with app.connection_for_write() as connection:
        full.bind(connection.default_channel).declare()
    try:
        repeat = fake_repeat()
        for each in (unconfirmed, app):
            repeat.register(name, each.main, every="1h", template={"task": f"{each.main}.t"})
            repeat.trigger(name, each.main)
        recorder = RecordingDispatcher()
        Pump(repeat, [name], recorder).run_once()
        sent = {o.name: o for o in recorder.occurrences}

        # Without confirms RabbitMQ's refusal goes unseen: counted sent, told once at start.
        with caplog.at_level(logging.WARNING, logger="emq_bridge.celery.dispatch"):
            CeleryDispatcher(unconfirmed).dispatch(sent[unconfirmed.main])
        warned = [r for r in caplog.records if "without broker_transport_options" in r.getMessage()]
        assert len(warned) == 1

        caplog.clear()
        dispatcher = CeleryDispatcher(app)
        with (
            caplog.at_level(logging.WARNING, logger="emq_bridge.celery.dispatch"),
            pytest.raises(DispatchError) as refused,
        ):
            dispatcher.dispatch(sent[app.main])
        assert "MessageNacked" in str(refused.value)  # was: "... failed: " and nothing
        assert not isinstance(refused.value, BrokerUnreachable)  # this message's, not the broker's
        assert not any("confirm_publish" in r.getMessage() for r in caplog.records)
    finally:
        with app.connection_for_write() as connection:
            full.bind(connection.default_channel).delete()
