"""A backfilled run marked `lost` (its worker stopped heartbeating) is out of band as its
reports are (docs/lifecycle.md, report.lua): its history entry says `lost` and the `lost`
count counts it, but the live schedule's `last_status`/`last_id`/`last_due` stay as they were.

Before, lost.lua set them from any lost occurrence not older than the record's `last_due`:
a registration whose live schedule had not fired yet (or was paused past the window) then
showed its last run `lost`, the backfilled one's. On a real server (lost.lua)."""

from __future__ import annotations

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.testing import RecordingDispatcher

S = 1000


def test_a_lost_backfilled_run_leaves_the_live_last_fields(repeat: Repeat) -> None:
    t0 = repeat.server_time_ms() // (10 * S) * (10 * S)
    repeat.upsert("q", "s", definition=define(every="1h", template={"task": "t"}), now_ms=t0)
    assert len(repeat.backfill("q", "s", t0 - 3 * 3_600 * S, t0 - 1, rate=0, now_ms=t0).queued)
    recorder = RecordingDispatcher()
    Pump(repeat, ["q"], recorder).run_once(t0 + S)  # the live slot is an hour away
    sent = recorder.clear()
    assert sent and all(o.backfill for o in sent)
    latest = max(sent, key=lambda o: o.due_ms)
    assert repeat.started(latest)
    member = latest.lease_member
    repeat.client.zadd(repeat.keys("q").running, {member: 0})  # its heartbeats lapsed

    assert [m[2] for m in repeat.mark_lost("q", [member])] == [latest.id]
    entry = next(e for e in repeat.history("q", "s") if e.id == latest.id)
    assert entry.status == "lost" and entry.backfill
    registration = repeat.get("q", "s")
    assert registration is not None
    assert registration.lost == 1  # counted, as a backfilled `skipped` is
    assert registration.last_status is None  # the live schedule has not run
    record = repeat.client.hgetall(repeat.keys("q").record("s"))
    assert b"last_id" not in record and b"last_due" not in record
