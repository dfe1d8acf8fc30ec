"""`resume --all` of many registrations that missed slots before their pause says so in a
few lines, as the pump says a catch-up of many at once: it logged one WARNING per
registration (3,000 lines for 3,000 schedules; 835 in one resume of a 100,000-schedule
queue)."""

from __future__ import annotations

import logging

import pytest

from emq_bridge import Repeat
from emq_bridge.definition import define

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
HOUR = 3_600_000


def test_resume_all_names_five_and_counts_the_rest(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"n{i:02d}" for i in range(12)]
    for name in names:
        repeat.upsert("q", name, definition=define(every="1h", template={"task": "t"}), now_ms=T0)
        # No pump ran: 01:00 and 02:00 passed before the pause at 02:30.
        repeat.pause("q", name, now_ms=T0 + 2 * HOUR + HOUR // 2)
    caplog.set_level(logging.DEBUG, logger="emq_bridge")
    resumed = repeat.resume_all("q", now_ms=T0 + 3 * HOUR + HOUR // 2)
    assert sorted(resumed) == names
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    named = [w for w in warnings if "passed before it was paused" in w]
    assert len(named) == 5 and all("2 slot(s)" in w for w in named)
    assert [w for w in warnings if w not in named] == [
        "q: 7 more registration(s) resumed with 14 slot(s) dropped that passed before their "
        "pause, counted in missed (listed at DEBUG)"
    ]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("slot(s) dropped at its resume" in line for line in debug) == 7
    assert all(repeat.get("q", name).missed == 2 for name in names)


def test_resume_by_name_still_says_it(repeat: Repeat, caplog: pytest.LogCaptureFixture) -> None:
    repeat.upsert("q", "one", definition=define(every="1h", template={"task": "t"}), now_ms=T0)
    repeat.pause("q", "one", now_ms=T0 + 2 * HOUR + HOUR // 2)
    caplog.set_level(logging.WARNING, logger="emq_bridge")
    assert repeat.resume("q", "one", now_ms=T0 + 3 * HOUR)
    assert "q/one: 2 slot(s) passed before it was paused" in caplog.text
