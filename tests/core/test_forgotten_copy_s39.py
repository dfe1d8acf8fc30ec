"""A copy of an occurrence the history has forgotten, refused at its start or on receipt: the
chaos soak of session 39 SIGKILLed a Dramatiq worker mid-run (marked lost), the history of
a 1 s schedule trimmed the entry within a minute, and minutes later the Redis broker gave the
dead worker's message back; the worker skipped it (another occurrence in flight), and its
`skipped` report made a fresh entry, counted: an occurrence that ran shown as never started.
Such a report is not applied once the history is full and the occurrence is older than its
oldest entry; a report of an occurrence it still spans is."""

from __future__ import annotations

from emq_bridge import Occurrence, Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher

CAP = 3
HOUR_MS = 3_600_000


def slots(repeat: Repeat, n: int) -> list[Occurrence]:
    repeat.register("q", "job", every="1h", template={"task": "t"}, immediately=True)
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["q"], sent)
    now = repeat.server_time_ms()
    for i in range(n):
        pump.run_once(now + i * HOUR_MS)
    return sent.clear()


def test_a_skipped_copy_of_an_occurrence_the_history_forgot_is_not_recorded(
    repeat: Repeat,
) -> None:
    first, *later = slots(repeat, CAP + 1)
    for occurrence in [first, *later]:
        assert repeat.report([report_of("succeeded", occurrence)], history_size=CAP) == 1
    assert first.id not in [e.id for e in repeat.history("q", "job")]  # trimmed
    for kind in ("skipped", "revoked"):
        copy = report_of(kind, first)  # type: ignore[arg-type]
        assert repeat.report([copy], history_size=CAP) == 0
    assert first.id not in [e.id for e in repeat.history("q", "job")]
    registration = repeat.get("q", "job")
    assert registration is not None and registration.skipped == 0


def test_a_skip_of_an_occurrence_the_history_still_spans_is_recorded(repeat: Repeat) -> None:
    first, second, third = slots(repeat, 3)
    for occurrence in (first, third):
        assert repeat.report([report_of("succeeded", occurrence)], history_size=CAP) == 1
    # The second one's first report, after a later one's: within the history's span.
    assert repeat.report([report_of("skipped", second)], history_size=CAP) == 1
    assert second.id in [e.id for e in repeat.history("q", "job")]
    registration = repeat.get("q", "job")
    assert registration is not None and registration.skipped == 1
