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
