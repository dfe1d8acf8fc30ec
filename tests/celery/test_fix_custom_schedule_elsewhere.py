"""A schedule only an app's objects decide (a Celery solar or relative schedule), stored as a
placeholder interval plus its label, is not fired by a beat whose app lacks it or has it as
another version (a rolling deploy): it is checked again a second later, for the beat that has
it.

Before, a beat of the old version fired such an entry as its placeholder (every day), moving
its next check a day on, so the new version's beat never ran it again; and an older
generation's beat ran its own, older schedule over the newer record's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.schedules import schedule

from emq_bridge import Pump, Repeat
from emq_bridge.cadence import Cadence
from emq_bridge.celery.entries import convert_schedule
from emq_bridge.definition import Definition
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000
APP = Celery("x", set_as_current=False)


def custom(seconds: float) -> Any:
    return convert_schedule(schedule(timedelta(seconds=seconds), relative=True), APP, "rel")


def pump_with(repeat: Repeat, live: Any | None, sent: RecordingDispatcher) -> Pump:
    def resolve(queue: str, name: str, stored: Cadence) -> Cadence:
        return live if live is not None and name == "rel" else stored

    return Pump(repeat, ["q"], sent, resolve_cadence=resolve)


def test_a_beat_without_the_schedule_or_with_another_version_leaves_it_alone(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    newer = custom(9)
    repeat.upsert_many([("q", "rel", Definition(newer, {"task": "t"}))], now_ms=T0)
    due = repeat.get("q", "rel").next_run_ms  # type: ignore[union-attr]
    assert due is not None
    for live in (None, custom(4)):  # the entry unknown to its app; an older version of it
        sent = RecordingDispatcher()
        pump = pump_with(repeat, live, sent)
        caplog.clear()
        for _ in range(2):
            pump.run_once(due)
            assert sent.occurrences == []
            after = repeat.get("q", "rel").next_run_ms  # type: ignore[union-attr]
            assert after == due + 1000  # checked again a second on, not a day
            due = after
        told = [r for r in caplog.records if "left to a pump whose app has it" in r.message]
        assert len(told) == 1 and told[0].levelname == "WARNING"  # once, not each second
    sent = RecordingDispatcher()
    pump_with(repeat, newer, sent).run_once(due)  # the beat that has it runs it
    assert [o.name for o in sent.occurrences] == ["rel"]
