"""A backfill's queued slots follow the schedule's later changes: a slot the schedule can no
longer have (bounds moved, a limit added, its slots placed otherwise) is dropped unsent and
may be backfilled again; while the schedule is paused they are held, and a resume sends them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.testing import RecordingDispatcher

UTC = timezone.utc
S = 1000
H = 3_600_000
T0 = int(datetime(2030, 1, 1, 12, tzinfo=UTC).timestamp() * 1000)
HOURLY: dict[str, Any] = {"every": "1h", "misfire": "skip", "template": {"task": "t"}}


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def backfilled_hours(recorder: RecordingDispatcher) -> list[int]:
    """The slots sent by a backfill, in hours from T0, in the order sent."""
    return [(o.due_ms - T0) // H for o in recorder.occurrences if o.backfill]


def queue_ten_and_send_one(repeat: Repeat) -> tuple[Pump, RecordingDispatcher]:
    """Ten past hourly slots backfilled at one a second; the first one sent."""
    repeat.upsert("q", "n", definition=define(**HOURLY), now_ms=T0)
    done = repeat.backfill("q", "n", T0 - 10 * H, T0 - H, rate=1, now_ms=T0)
    assert len(done.queued) == 10
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once(T0 + 500)
    assert backfilled_hours(recorder) == [-10]
    return pump, recorder


def pump_for(pump: Pump, seconds: int, start: int = T0 + S) -> None:
    for second in range(seconds):
        pump.run_once(start + second * S)


def pending(repeat: Repeat) -> list[str]:
    """The backfilled slots still queued, as their lease members."""
    members = repeat.client.zrange(repeat.keys("q").leases, 0, -1)
    return [m.decode() for m in members if m.endswith(b" backfill")]


def ledger(repeat: Repeat) -> list[int]:
    members = repeat.client.zrange(repeat.keys("q").backfilled("n"), 0, -1)
    return [(int(m) - T0) // H for m in members]


@pytest.mark.parametrize(
    ("change", "sent"),
    [
        ({"limit": 2}, [-10]),
        ({"start_at": at(T0 - 2 * H)}, [-10, -2, -1]),
        ({"start_at": at(T0 - 3 * H), "end_at": at(T0 + 5 * H)}, [-10, -3, -2, -1]),
        ({"end_at": at(T0 + 5 * H), "start_at": at(T0 - 20 * H)}, list(range(-10, 0))),
        ({"every": "7m"}, [-10]),
        ({"every": "1h", "offset": "5m"}, [-10]),
        ({"jitter": "10m"}, list(range(-10, 0))),  # the nominal slots stay: all sent
        ({"every": "30m"}, [-10]),  # slots of the new grid too, but placed otherwise
    ],
    ids=["limit", "start_at", "start_and_end", "wider", "every", "offset", "jitter", "every_30m"],
)
def test_the_queued_slots_a_changed_schedule_cannot_have_are_not_sent(
    repeat: Repeat, change: dict[str, Any], sent: list[int]
) -> None:
    pump, recorder = queue_ten_and_send_one(repeat)
    repeat.upsert("q", "n", definition=define(**{**HOURLY, **change}), now_ms=T0 + 600)
    pump_for(pump, 20)
    assert backfilled_hours(recorder) == sent
    # The dropped ones are no longer pending, and off the ledger: a later backfill may
    # queue them again if the schedule has them again; the sent ones stay on it.
    assert pending(repeat) == []
    assert ledger(repeat) == sent
    dropped = 10 - len(sent)
    assert int(repeat.client.hget(repeat.keys("q").record("n"), "backfill_dropped") or 0) == dropped


def test_a_slot_dropped_by_a_bound_is_backfilled_again_once_the_bound_is_widened(
    repeat: Repeat,
) -> None:
    pump, recorder = queue_ten_and_send_one(repeat)
    late = define(**HOURLY, start_at=at(T0 - 2 * H))
    repeat.upsert("q", "n", definition=late, now_ms=T0 + 600)
    pump_for(pump, 20)
    assert backfilled_hours(recorder) == [-10, -2, -1]
    repeat.upsert("q", "n", definition=define(**HOURLY), now_ms=T0 + 30 * S)
    again = repeat.backfill("q", "n", T0 - 10 * H, T0 - H, rate=0, now_ms=T0 + 30 * S)
    assert [(s - T0) // H for s in again.queued] == list(range(-9, -2)) and again.done == 3
    pump_for(pump, 3, T0 + 31 * S)
    assert sorted(backfilled_hours(recorder)) == list(range(-10, 0))  # each once


def test_the_queued_slots_of_a_paused_schedule_are_held_and_sent_once_it_resumes(
    repeat: Repeat,
) -> None:
    pump, recorder = queue_ten_and_send_one(repeat)
    repeat.pause("q", "n")
    pump_for(pump, 20)
    assert backfilled_hours(recorder) == [-10]
    assert len(pending(repeat)) == 9  # still pending, none lost
    repeat.resume("q", "n", now_ms=T0 + 21 * S)
    pump_for(pump, 3, T0 + 21 * S)
    assert backfilled_hours(recorder) == [-10]  # looked at again a lease (60 s) later
    pump_for(pump, 20, T0 + 90 * S)
    assert sorted(backfilled_hours(recorder)) == list(range(-10, 0))
    assert not any(o.redelivered for o in recorder.occurrences)
    assert repeat.leases("q") == []


def test_a_cron_schedule_changed_drops_its_queued_slots_and_a_backfill_requeues_them(
    repeat: Repeat,
) -> None:
    cron = {"cron": "0 * * * *", "misfire": "skip", "template": {"task": "t"}}
    repeat.upsert("q", "n", definition=define(**cron), now_ms=T0)
    repeat.backfill("q", "n", T0 - 6 * H, T0 - H, rate=1, now_ms=T0)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once(T0 + 500)
    changed = {**cron, "cron": "30 * * * *"}
    repeat.upsert("q", "n", definition=define(**changed), now_ms=T0 + 600)
    pump_for(pump, 10)
    assert backfilled_hours(recorder) == [-6]  # no :00 slot of the new cadence
    # The same cadence back: the dropped slots are slots again, a backfill queues them.
    repeat.upsert("q", "n", definition=define(**cron), now_ms=T0 + 20 * S)
    again = repeat.backfill("q", "n", T0 - 6 * H, T0 - H, rate=0, now_ms=T0 + 20 * S)
    assert len(again.queued) == 5 and again.done == 1
    pump_for(pump, 2, T0 + 21 * S)
    assert sorted(backfilled_hours(recorder)) == list(range(-6, 0))


def test_a_backfill_after_a_cadence_change_drops_the_slots_still_queued_under_the_old_one(
    repeat: Repeat,
) -> None:
    # Queued at one a second under 1h; the cadence becomes 7m; a new backfill queues 7m
    # slots and stores their signature: the 1h slots still queued must not go out with it.
    repeat.upsert("q", "n", definition=define(**HOURLY), now_ms=T0)
    repeat.backfill("q", "n", T0 - 10 * H, T0 - H, rate=1, now_ms=T0)
    repeat.upsert("q", "n", definition=define(**{**HOURLY, "every": "7m"}), now_ms=T0 + 100)
    seven = repeat.backfill("q", "n", T0 - 35 * 60 * S, T0 - 60 * S, rate=0, now_ms=T0 + 200)
    assert len(seven.queued) == 5
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump_for(pump, 15)
    sent = sorted(o.due_ms for o in recorder.occurrences if o.backfill)
    assert sent == seven.queued  # 7m slots only
    assert repeat.leases("q") == []
    assert ledger(repeat) == [(s - T0) // H for s in seven.queued]


def test_the_queued_slots_of_a_record_gone_are_dropped_by_the_pump_and_reported(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    pump, recorder = queue_ten_and_send_one(repeat)
    repeat.client.delete(repeat.keys("q").record("n"))  # gone by hand, its leases left
    pump_for(pump, 20)
    assert backfilled_hours(recorder) == [-10]
    assert pending(repeat) == [] and repeat.leases("q") == []
    assert "the registration is gone or corrupt" in caplog.text


def test_a_backfill_computed_from_a_cadence_changed_since_writes_nothing(repeat: Repeat) -> None:
    # Slots computed from the cadence read (1h) must not be queued under the new one's
    # signature: the script compares the `cadence_digest` read and the caller reads again.
    repeat.upsert("q", "n", definition=define(**HOURLY), now_ms=T0)
    keys = repeat.keys("q")
    read = repeat.client.hget(keys.record("n"), "cadence_digest").decode()
    repeat.upsert("q", "n", definition=define(**{**HOURLY, "every": "7m"}), now_ms=T0)
    score = str(int(repeat.client.zscore(keys.registry, "n")))
    before = sorted(repeat.client.keys(f"{repeat.prefix}:*"))
    reply = repeat.scripts.backfill(
        keys=[keys.registry, keys.record("n"), keys.leases, keys.backfilled("n")],
        args=["n", score, "", "", f'["{T0 - H}"]', T0, 0, "", keys.wake_channel, read],
    )
    assert reply == -2
    assert sorted(repeat.client.keys(f"{repeat.prefix}:*")) == before and pending(repeat) == []
