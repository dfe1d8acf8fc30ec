"""The beat's line per task sent said `Scheduler: sent celery/td3 (papp.rec) id ...`, where
Celery's own beat says `Scheduler: Sending due task td3 (papp.rec)`: a log alert grepping
Celery's words went quiet after the switch (a probe comparing the two beats). It now starts
with Celery's words, then says the id and queue."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler

from emq_bridge.celery.beat import BeatLog
from emq_bridge.occurrence import Occurrence


def test_the_line_per_task_sent_starts_with_celerys_own(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("papp", broker="memory://")
    entry = ScheduleEntry(name="td3", task="papp.rec", schedule=timedelta(seconds=3), app=app)
    scheduler = Scheduler(app, lazy=True)
    scheduler.apply_async = lambda *a, **k: None  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        scheduler.apply_entry(entry)
        celerys = caplog.messages[-1]
        occurrence = Occurrence(
            queue="celery",
            name="td3",
            due_ms=1_000,
            id="occ-1",
            template={"task": "papp.rec"},
            released_ms=1_000,
        )
        BeatLog().on_dispatch(occurrence)
        ours = caplog.messages[-1]
    assert celerys == "Scheduler: Sending due task td3 (papp.rec)"
    assert ours == f"{celerys} id occ-1 queue celery"
