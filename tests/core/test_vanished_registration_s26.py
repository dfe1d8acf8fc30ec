"""A registration removed between a pump's scan and its read of the records (a sync pruning
it) is gone, not corrupt (found by a probe, session 26: logged at ERROR as "registry member
has no record" and counted parked on routine prunes). Real server and fakeredis."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000


def test_a_registration_removed_after_the_scan_is_neither_parked_nor_an_error(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    any_repeat.upsert("q", "gone", every="1s", template={"task": "t"}, now_ms=T0)
    any_repeat.upsert("q", "kept", every="1s", template={"task": "t"}, now_ms=T0)
    load_records = any_repeat.load_records

    def cancelled_first(queue: str, names: Any, *args: Any, **kwargs: Any) -> Any:
        any_repeat.cancel("q", "gone")  # between the scan and this read
        return load_records(queue, names, *args, **kwargs)

    monkeypatch.setattr(any_repeat, "load_records", cancelled_first)
    dispatcher = RecordingDispatcher()
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        tick = Pump(any_repeat, ["q"], dispatcher).run_once(now_ms=T0 + 1000)
    assert tick.parked == []
    assert [o.name for o in dispatcher.occurrences] == ["kept"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
