"""Edits that bound or exclude slots, while a slot is overdue; `immediately` on an excluded
instant (docs/timing.md). Found by a probe.

- Adding `end_at`, `start_at` or an exclusion that does not cover the overdue slot, while
  no pump runs, dropped that slot as if the cadence had changed (`missed` 1, a WARNING),
  though the new definition still has it. Now the registration resumes at the first slot at
  or after its score the new definition fires, still overdue, and the pump's misfire policy
  handles it as it would have.
- `immediately=True` fired at once on an instant its exclusions cover.
- A slot already overdue when a registration was paused was dropped at its resume without
  being counted in `missed`, unlike any other slot no pump sent.
- `sync --dry-run` (and `sync`'s diff) showed a bounds-only change as no change at all.
- The catch-up line of an `anchor="release"` interval named the first passed interval as
  the last one too (`2 passed, 10:17:23 to 10:17:23`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_runs import cli_runner

from emq_bridge import Pump, Repeat, define
from emq_bridge.cadence import Every, catch_up
from emq_bridge.testing import ManualClock, RecordingDispatcher, manual_pump

TEMPLATE = {"task": "t"}


def _at(hour: int, minute: int = 0, day: int = 1) -> datetime:
    return datetime(2030, 1, day, hour, minute, tzinfo=timezone.utc)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _pumped(repeat: Repeat, start: datetime) -> tuple[ManualClock, RecordingDispatcher, Pump]:
    """A clock at `start`, and a pump of queue q on it that records what it sends."""
    clock = ManualClock(_ms(start))
    sent = RecordingDispatcher()
    return clock, sent, manual_pump(repeat, ["q"], clock, sent)


def _edited_while_overdue(
    repeat: Repeat, before: dict[str, Any], after: dict[str, Any]
) -> tuple[list[int], int, RecordingDispatcher]:
    """Register `before` at 09:30, edit it to `after` at 10:30 (10:00 overdue, no pump ran),
    then pump at 10:30 and 11:00: the slots fired and the missed count."""
    clock, sent, pump = _pumped(repeat, _at(9, 30))
    repeat.upsert("q", "x", definition=define(template=TEMPLATE, **before), now_ms=clock())
    clock.set(_ms(_at(10, 30)))
    repeat.upsert("q", "x", definition=define(template=TEMPLATE, **after), now_ms=clock())
    pump.run_once()
    clock.set(_ms(_at(11)))
    pump.run_once()
    registration = repeat.get("q", "x")
    assert registration is not None
    return [o.due_ms for o in sent.occurrences], registration.missed, sent


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"every": "1h"}, {"every": "1h", "end_at": _at(23)}),
        ({"every": "1h"}, {"every": "1h", "start_at": _at(0)}),
        ({"every": "1h"}, {"every": "1h", "exclude": ["2031-01-01"]}),
        (
            {"cron": "0 * * * *", "tz": "Europe/Paris"},
            {"cron": "0 * * * *", "tz": "Europe/Paris", "end_at": _at(23)},
        ),
        ({"every": "1h", "end_at": _at(23)}, {"every": "1h", "end_at": _at(22)}),
    ],
    ids=["end_at", "start_at", "exclude-elsewhere", "cron-end_at", "end_at-moved"],
)
def test_a_bound_or_exclusion_edit_keeps_the_overdue_slot(
    repeat: Repeat,
    caplog: pytest.LogCaptureFixture,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        fired, missed, _ = _edited_while_overdue(repeat, before, after)
    assert fired == [_ms(_at(10)), _ms(_at(11))]
    assert missed == 0
    assert not [r for r in caplog.records if "overdue" in r.getMessage()]


def test_an_exclusion_covering_the_overdue_slot_skips_it_uncounted(repeat: Repeat) -> None:
    # 10:00 is excluded now: the next slot the definition fires is 11:00 (not overdue at
    # 10:30), and an excluded slot is not a missed one.
    window = "2030-01-01T09:45..2030-01-01T10:15"
    fired, missed, _ = _edited_while_overdue(
        repeat, {"every": "1h"}, {"every": "1h", "exclude": [window]}
    )
    assert fired == [_ms(_at(11))]
    assert missed == 0


def test_an_excluded_overdue_slot_resumes_at_the_next_passed_one_under_the_misfire_policy(
    repeat: Repeat,
) -> None:
    # The pump was down 08:00 to 10:30; 08:00 is excluded by the edit, 09:00 and 10:00 are
    # not: the default policy (latest) fires 10:00 and counts 09:00 missed, as without it.
    clock, sent, pump = _pumped(repeat, _at(7, 30))
    repeat.upsert("q", "x", definition=define(every="1h", template=TEMPLATE), now_ms=clock())
    clock.set(_ms(_at(10, 30)))
    excluded = define(every="1h", exclude=["2030-01-01T07:45..2030-01-01T08:15"], template=TEMPLATE)
    repeat.upsert("q", "x", definition=excluded, now_ms=clock())
    pump.run_once()
    registration = repeat.get("q", "x")
    assert registration is not None
    assert [o.due_ms for o in sent.occurrences] == [_ms(_at(10))]
    assert registration.missed == 1


def test_a_changed_cadence_while_overdue_still_drops_and_counts(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        fired, missed, _ = _edited_while_overdue(repeat, {"every": "1h"}, {"every": "30m"})
    assert fired == [_ms(_at(11))]
    assert missed == 1
    assert [r for r in caplog.records if "overdue" in r.getMessage()]


def test_a_pump_claim_between_the_two_calls_keeps_the_claimed_score(repeat: Repeat) -> None:
    # The second call resumes only if the score is still the one read: a slot claimed in
    # between (the score moved) is not put back, so it cannot fire twice.
    clock, sent, pump = _pumped(repeat, _at(9, 30))
    repeat.upsert("q", "x", definition=define(every="1h", template=TEMPLATE), now_ms=clock())
    clock.set(_ms(_at(10, 30)))
    client = repeat.client
    original = repeat._resume_slots

    def claim_in_between(*args: Any, **kwargs: Any) -> Any:
        read = original(*args, **kwargs)
        pump.run_once()  # fires 10:00; the score moves to 11:00
        return read

    repeat._resume_slots = claim_in_between  # type: ignore[method-assign]
    try:
        bounded = define(every="1h", end_at=_at(23), template=TEMPLATE)
        repeat.upsert("q", "x", definition=bounded, now_ms=clock())
    finally:
        del repeat._resume_slots
    assert client is repeat.client
    pump.run_once()
    registration = repeat.get("q", "x")
    assert registration is not None
    assert [o.due_ms for o in sent.occurrences] == [_ms(_at(10))]
    assert registration.next_run_ms == _ms(_at(11)) and registration.missed == 0


def test_immediately_does_not_fire_on_an_excluded_instant(repeat: Repeat) -> None:
    clock, _, pump = _pumped(repeat, _at(9, 30))
    held = define(every="1h", immediately=True, exclude=["2030-01-01"], template=TEMPLATE)
    repeat.upsert("q", "held", definition=held, now_ms=clock())
    registration = repeat.get("q", "held")
    assert registration is not None
    assert registration.next_run_ms == _ms(_at(0, day=2))
    assert pump.run_once().dispatched == []
    # Not excluded: it still fires at once.
    free = define(every="1h", immediately=True, exclude=["2030-01-02"], template=TEMPLATE)
    repeat.upsert("q", "free", definition=free, now_ms=clock())
    assert [o.due_ms for o in pump.run_once().dispatched] == [clock()]


def test_a_release_anchored_catch_up_names_the_newest_passed_interval() -> None:
    every = Every(600_000, anchor="release")
    due = _ms(_at(10, 17))
    step = catch_up(every, due, due + 13 * 60_000, "latest")
    assert (step.passed, step.missed, step.first_ms) == (2, 1, due)
    assert step.last_ms == due + 600_000


def test_slots_missed_before_a_pause_are_counted_when_a_resume_drops_them(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    # No pump ran from 09:30; 10:00 and 11:00 passed before the pause at 11:30, 12:00 and
    # 13:00 while paused. A resume at 13:30 without catch-up fires none of them: the two
    # before the pause were missed (counted, one line), the two after it were paused.
    clock, sent, pump = _pumped(repeat, _at(9, 30))
    repeat.upsert("q", "x", definition=define(every="1h", template=TEMPLATE), now_ms=clock())
    repeat.upsert("q", "y", definition=define(every="1h", template=TEMPLATE), now_ms=clock())
    clock.set(_ms(_at(11, 30)))
    repeat.pause("q", "x", now_ms=clock())
    clock.set(_ms(_at(12, 10)))
    pump.run_once()  # y catches up (fires 12:00, 10:00 and 11:00 missed); x is paused
    repeat.pause("q", "y", now_ms=clock())  # y was on time when paused
    clock.set(_ms(_at(13, 30)))
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        assert repeat.resume("q", "x", now_ms=clock())
        assert repeat.resume("q", "y", now_ms=clock())
    x, y = repeat.get("q", "x"), repeat.get("q", "y")
    assert x is not None and y is not None
    assert (x.missed, x.next_run_ms) == (2, _ms(_at(14)))
    assert (y.missed, y.next_run_ms) == (2, _ms(_at(14)))  # only its catch-up's two
    lines = [r.getMessage() for r in caplog.records if "before it was paused" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("q/x: 2 slot(s)")
    pump.run_once()
    assert [o.name for o in sent.occurrences] == ["y"]


def test_a_resume_with_catch_up_hands_the_slots_before_the_pause_to_the_policy(
    repeat: Repeat,
) -> None:
    clock, sent, pump = _pumped(repeat, _at(9, 30))
    repeat.upsert("q", "x", definition=define(every="1h", template=TEMPLATE), now_ms=clock())
    clock.set(_ms(_at(11, 30)))
    repeat.pause("q", "x", now_ms=clock())
    clock.set(_ms(_at(13, 30)))
    assert repeat.resume("q", "x", catchup=True, now_ms=clock())
    pump.run_once()
    x = repeat.get("q", "x")
    assert x is not None
    assert [o.due_ms for o in sent.occurrences] == [_ms(_at(13))]
    assert x.missed == 3  # 10:00, 11:00, 12:00: the policy's count, not twice


def test_sync_dry_run_names_a_bounds_change(redis_url: str, prefix: str, tmp_path: Path) -> None:
    # It showed `~ q/x  every 1h`, as if nothing changed, for an end_at added.
    run = cli_runner(redis_url, prefix)
    path = tmp_path / "schedules.toml"
    path.write_text('queue = "q"\n[[schedule]]\nname = "x"\ntask = "t"\nevery = "1h"\n')
    assert run("sync", str(path)).exit_code == 0
    path.write_text(path.read_text() + 'end_at = "2099-01-01T00:00:00Z"\n')
    dry = run("sync", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines() == ["~ q/x  every 1h, bounds none -> until 2099-01-01T00:00:00Z"]
