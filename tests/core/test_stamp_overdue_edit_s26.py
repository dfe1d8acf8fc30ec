"""A stamped sync that edits the cadence of an overdue record stamps its queues (found by a
probe, session 26: the first boot after an upgrade, or after the pumps were down a while,
logged "another writer changed its schedules during the sync" with no other writer, and the
next boot synced in full). `upsert.lua` counted the item it hands back for the overdue edit
(digit 6: nothing written) as a write, then the write of the call that sent it again.
Real server; the registry's clock is a `ManualClock`, so "overdue" is exact."""

from __future__ import annotations

import logging

import pytest
import redis

from emq_bridge import Declaration, Repeat, define
from emq_bridge.sync import sync
from emq_bridge.testing import ManualClock


def test_an_overdue_records_edit_is_stamped(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(1_900_000_000_000)
    repeat = Repeat(client, prefix, clock=clock)

    def declared(anchor: str) -> list[Declaration]:
        return [Declaration("q", "a", define(every="1s", anchor=anchor, template={"task": "t"}))]

    sync(repeat, declared("schedule"), "src", stamp=True)
    clock.advance(2_500)  # no pump ran: its next run passed
    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        edited = sync(repeat, declared("grid"), "src", stamp=True)
    assert [d.name for d in edited.update] == ["a"]
    assert not [r for r in caplog.records if "not stamped" in r.getMessage()]
    again = sync(repeat, declared("grid"), "src", stamp=True)
    assert again.by_stamp  # the stamp holds: nothing read or written
