"""A definition edited while its registration is paused kept no paused window: the edit
re-parked it at the new cadence's first slot after the edit, so `resume(catchup=True)` fired
nothing of the slots that passed while it was paused and counted none in `missed` (found by
a probe racing edits, pauses and resumes against pumps, session 33). The window now starts
at the new definition's first slot at or after the parked one, and the misfire policy takes
it as it does without an edit. On the test server and on fakeredis (`any_repeat`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from emq_bridge import Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

UTC = timezone.utc
START = datetime(2030, 1, 1, tzinfo=UTC)
TEMPLATE = {"task": "t"}


def at(hour: int, minute: int = 0) -> int:
    return int((START + timedelta(hours=hour, minutes=minute)).timestamp() * 1000)


def paused_from_one_ten(repeat: Repeat, names: tuple[str, ...], **cadence: str) -> Pump:
    """`names`, hourly (or `cadence`) from 00:00, fired at 01:00, paused at 01:10."""
    clock = repeat.clock
    assert isinstance(clock, ManualClock)
    for name in names:
        repeat.upsert("q", name, template=TEMPLATE, **(cadence or {"every": "1h"}))
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    clock.set(at(1))
    assert len(pump.run_once().dispatched) == len(names)
    clock.set(at(1, 10))
    for name in names:
        assert repeat.pause("q", name)
    return pump


def fired(pump: Pump, name: str) -> list[int]:
    return [o.due_ms for o in pump.run_once().dispatched if o.name == name]


def test_a_cadence_edited_while_paused_keeps_the_window_for_a_catch_up(any_repeat: Repeat) -> None:
    clock = any_repeat.clock = ManualClock(START)
    pump = paused_from_one_ten(any_repeat, ("control", "edited"))
    clock.set(at(5, 10))  # 02:00 to 05:00 passed while paused
    any_repeat.upsert("q", "edited", every="2h", template=TEMPLATE)
    edited = any_repeat.get("q", "edited")
    assert edited is not None and edited.paused and edited.next_run_ms == at(2)

    clock.set(at(5, 30))
    for name in ("control", "edited"):
        assert any_repeat.resume("q", name, catchup=True)
    dispatched = pump.run_once().dispatched
    # `latest`: the newest slot of the window fires, the ones before it are counted.
    assert sorted((o.name, o.due_ms) for o in dispatched) == [
        ("control", at(5)),
        ("edited", at(4)),
    ]
    control, edited = any_repeat.get("q", "control"), any_repeat.get("q", "edited")
    assert control is not None and control.missed == 3
    assert edited is not None and edited.missed == 1 and edited.next_run_ms == at(6)


def test_a_plain_resume_after_an_edit_while_paused_drops_the_window_uncounted(
    any_repeat: Repeat,
) -> None:
    clock = any_repeat.clock = ManualClock(START)
    pump = paused_from_one_ten(any_repeat, ("edited",))
    clock.set(at(5, 10))
    any_repeat.upsert("q", "edited", every="2h", template=TEMPLATE)
    clock.set(at(5, 30))
    assert any_repeat.resume("q", "edited")
    edited = any_repeat.get("q", "edited")
    assert edited is not None and edited.next_run_ms == at(6) and edited.missed == 0
    assert fired(pump, "edited") == []


def test_a_cron_edited_while_paused_starts_its_window_on_its_own_slots(
    any_repeat: Repeat,
) -> None:
    clock = any_repeat.clock = ManualClock(START)
    pump = paused_from_one_ten(any_repeat, ("nightly",), cron="0 * * * *")
    clock.set(at(5, 10))
    any_repeat.upsert("q", "nightly", cron="30 */2 * * *", template=TEMPLATE)  # 00:30, 02:30, …
    edited = any_repeat.get("q", "nightly")
    assert edited is not None and edited.next_run_ms == at(2, 30)
    clock.set(at(5, 20))
    assert any_repeat.resume("q", "nightly", catchup=True)
    assert fired(pump, "nightly") == [at(4, 30)]


def test_an_edit_while_paused_before_the_parked_slot_passed_changes_nothing_of_the_rule(
    any_repeat: Repeat,
) -> None:
    clock = any_repeat.clock = ManualClock(START)
    paused_from_one_ten(any_repeat, ("soon",))
    clock.set(at(1, 30))  # the parked 02:00 has not passed: no window yet
    any_repeat.upsert("q", "soon", every="2h", template=TEMPLATE)
    soon = any_repeat.get("q", "soon")
    assert soon is not None and soon.paused and soon.next_run_ms == at(2)
