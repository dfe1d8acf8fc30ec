"""A task's error that is not valid UTF-8, or cannot be printed (found by a probe).

- An error holding a lone surrogate (a file name read with `surrogateescape`) became a
  JSON escape Redis's Lua rejects: the whole `report.lua` batch failed, so the other
  occurrences' reports in it were dropped too, and a guarded schedule stayed in flight.
- `Repeat.finished` (documented "never raises") raised when the exception's `__str__` did.
"""

from __future__ import annotations

import pytest

from emq_bridge import Pump, Repeat, ScheduleError
from emq_bridge.lifecycle import report_of
from emq_bridge.occurrence import Occurrence
from emq_bridge.outcome import Report, error_text
from emq_bridge.reporting import Reporter
from emq_bridge.testing import RecordingDispatcher

SURROGATE_NAME = b"report-\xff.csv".decode("utf-8", "surrogateescape")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class Recursive(Exception):
    def __str__(self) -> str:
        return str(self)


def _fired(repeat: Repeat, *names: str) -> dict[str, Occurrence]:
    for name in names:
        repeat.register("q", name, every="1h", template={"task": "t"})
        repeat.trigger("q", name)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    return {o.name: o for o in sent.occurrences}


def _status(repeat: Repeat, name: str) -> tuple[str, str | None]:
    (entry,) = repeat.history("q", name)
    return entry.status, entry.error


def test_a_surrogate_in_an_error_is_kept_escaped_and_spares_the_batch(repeat: Repeat) -> None:
    fired = _fired(repeat, "good", "bad")
    good = report_of("succeeded", fired["good"])
    bad = report_of("failed", fired["bad"], error=ValueError(f"cannot parse {SURROGATE_NAME}"))
    assert repeat.report([good, bad]) == 2
    assert _status(repeat, "good") == ("succeeded", None)
    assert _status(repeat, "bad") == ("failed", "ValueError: cannot parse report-\\udcff.csv")


def test_the_reporter_thread_sends_such_an_error_with_the_rest(repeat: Repeat) -> None:
    fired = _fired(repeat, "good", "bad")
    reporter = Reporter(repeat, linger_s=0.0)
    try:
        for name in ("good", "bad"):
            reporter.report(report_of("started", fired[name]))
        start = report_of("started", fired["bad"])
        reporter.finish(start, "failed", start.at_ms + 5, error_text(OSError(SURROGATE_NAME)))
        reporter.report(report_of("succeeded", fired["good"]))
        assert reporter.flush(10.0)
    finally:
        reporter.close()
    assert _status(repeat, "good") == ("succeeded", None)
    assert _status(repeat, "bad") == ("failed", "OSError: report-\\udcff.csv")


@pytest.mark.parametrize("error", [Unprintable(), Recursive()], ids=["raises", "recurses"])
def test_finished_never_raises_on_an_unprintable_error(repeat: Repeat, error: Exception) -> None:
    fired = _fired(repeat, "x")
    assert repeat.finished(fired["x"], ok=False, error=error)
    status, text = _status(repeat, "x")
    assert status == "failed"
    assert text == f"{type(error).__name__}: (its message could not be read)"


def test_a_report_built_by_hand_with_invalid_utf8_is_refused_clearly() -> None:
    with pytest.raises(ScheduleError, match=r"report error .* is not valid UTF-8"):
        Report("failed", "q", "x", "q-x-1", 0, 1, error=SURROGATE_NAME)
    with pytest.raises(ScheduleError, match=r"report id .* is not valid UTF-8"):
        Report("started", "q", "x", SURROGATE_NAME, 0, 1)
