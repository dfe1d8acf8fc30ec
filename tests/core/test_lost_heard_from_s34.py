"""A run a pump marked `lost` whose worker is heard from afterwards (cut off from Redis by a
partition, not gone) no longer counts in the registration's `lost`, as its history entry no
longer says `lost` (found by a probe of a registry behind a bad network, session 34: after a
60 s partition, two runs that had succeeded stayed counted `lost=2`). The `lost` outcome
metric, a count of events, still counted the pump's verdict. On a real server (report.lua).
"""

from __future__ import annotations

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher

S = 1000


def marked_lost(repeat: Repeat, name: str) -> Occurrence:
    repeat.register("q", name, every="1h", template={"task": "t"}, immediately=True)
    recorder = RecordingDispatcher()
    Pump(repeat, ["q"], recorder).run_once()
    (occurrence,) = recorder.clear()
    assert repeat.started(occurrence)
    repeat.client.zadd(repeat.keys("q").running, {occurrence.lease_member: 0})
    assert repeat.mark_lost("q", [occurrence.lease_member])
    registration = repeat.get("q", name)
    assert registration is not None and registration.lost == 1
    return occurrence


def test_a_lost_run_heard_from_after_is_lost_no_more(repeat: Repeat) -> None:
    occurrence = marked_lost(repeat, "cut-off")
    assert repeat.finished(occurrence, ok=True)  # the report it kept through the partition
    registration = repeat.get("q", "cut-off")
    assert registration is not None
    assert registration.lost == 0 and registration.last_status == "succeeded"
    assert repeat.finished(occurrence, ok=True) is False  # sent twice: nothing moves twice
    assert repeat.get("q", "cut-off").lost == 0  # type: ignore[union-attr]


def test_a_redelivered_copy_that_starts_then_is_lost_again_counts_once(repeat: Repeat) -> None:
    occurrence = marked_lost(repeat, "again")
    assert repeat.report([report_of("started", occurrence, attempt=1)]) == 1
    assert repeat.get("q", "again").lost == 0  # type: ignore[union-attr]
    repeat.client.zadd(repeat.keys("q").running, {occurrence.lease_member: 0})
    assert repeat.mark_lost("q", [occurrence.lease_member])
    assert repeat.get("q", "again").lost == 1  # type: ignore[union-attr]


def test_a_refused_copy_of_a_lost_run_leaves_it_lost_and_counted(repeat: Repeat) -> None:
    occurrence = marked_lost(repeat, "refused")
    assert repeat.report([report_of("revoked", occurrence)]) == 0
    assert repeat.get("q", "refused").lost == 1  # type: ignore[union-attr]
