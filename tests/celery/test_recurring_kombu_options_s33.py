"""`@recurring(options={"queue": Queue(...)})` failed at import ("template is not
JSON-serialisable: Object of type Queue"), where the same options in a `beat_schedule` entry
are stored as the entity's description and routed as the object (found by a probe of
definition fidelity, session 33): moving an entry to the decorator broke it. Both declare
the same schedule now.
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from kombu import Exchange, Queue

from emq_bridge.celery import app_schedule, recurring


def test_recurring_takes_kombu_entities_in_options_as_beat_schedule_does() -> None:
    queue = Queue("reports", Exchange("reports", type="direct"), routing_key="reports.daily")
    app = Celery("s33kombu", broker="redis://127.0.0.1:6399/0")  # never connected to
    app.conf.beat_schedule = {
        "entry": {"task": "s33kombu.t", "schedule": timedelta(hours=1), "options": {"queue": queue}}
    }

    @recurring(every=timedelta(hours=1), options={"queue": queue}, name="decorated")
    @app.task(name="s33kombu.t")
    def t() -> None: ...

    declared = {d.name: d for d in app_schedule(app).declarations}
    entry, decorated = declared["entry"], declared["decorated"]
    assert entry.queue == decorated.queue
    assert decorated.definition.template["options"] == entry.definition.template["options"]
    assert decorated.definition.template["options"]["queue"]["name"] == "reports"


def test_the_dispatcher_reads_a_countdown_or_an_eta_as_the_wait_before_a_start() -> None:
    # Session 33 (a probe of Celery's send options): what the pump adds to a guarded
    # occurrence's start timeout (tests/core/test_countdown_start_timeout_s33.py).
    from datetime import datetime, timezone

    from emq_bridge.celery import CeleryDispatcher

    dispatcher = CeleryDispatcher(Celery("s33delay", broker="redis://127.0.0.1:6399/0"))
    assert dispatcher.delay_ms({"task": "t", "options": {"countdown": 660}}) == 660_000
    assert dispatcher.delay_ms({"task": "t", "options": {"countdown": 0}}) is None
    assert dispatcher.delay_ms({"task": "t"}) is None
    later = datetime.now(timezone.utc).timestamp() + 600
    eta = datetime.fromtimestamp(later, timezone.utc).isoformat()
    waited = dispatcher.delay_ms({"task": "t", "options": {"eta": eta}})
    assert waited is not None and 590_000 < waited <= 600_000
    assert dispatcher.delay_ms({"task": "t", "options": {"eta": "2000-01-01T00:00:00"}}) is None
