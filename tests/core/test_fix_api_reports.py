"""`Report` refuses what the registry could not read back, on the real server.

A float `at_ms` (`time.time() * 1000`) was stored as `last_finished_ms = b'1796….555'`, after
which `get` returned None and `list` skipped the registration as corrupt; a text `at_ms` made
the history unreadable, and a text `due_ms` a Lua error. Each is now a `ScheduleError` at
construction, so nothing reaches Redis, while the adapters' never-raise paths drop such a
report with one log line.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.broker import MessageProxy
from registry_state import snapshot

from emq_bridge import InvalidName, Repeat, Report, ScheduleError
from emq_bridge.cadence import LATEST_MS
from emq_bridge.dramatiq.outcomes import MessageOutcomes, start_report
from emq_bridge.dramatiq.schedule import OPTION_DUE_MS, OPTION_NAME, OPTION_QUEUE
from emq_bridge.reporting import Reporter

DUE = 1_800_000_000_000
ID = "0b6cf1a2-6f0e-4b8e-9d7e-1f2a3b4c5d6e"


def _fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "kind": "succeeded",
        "queue": "q",
        "name": "a",
        "id": ID,
        "due_ms": DUE,
        "at_ms": DUE + 1_000,
    }
    fields.update(changes)
    return fields


@pytest.fixture
def registered(repeat: Repeat) -> Repeat:
    repeat.upsert("q", "a", every="1h", template={"task": "t"}, now_ms=DUE - 1)
    return repeat


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"at_ms": time.time() * 1000}, "at_ms must be an int of epoch ms (int(time.time()"),
        ({"at_ms": "xyz"}, "at_ms must be an int of epoch ms"),
        ({"at_ms": LATEST_MS + 1}, "at_ms must be epoch ms from 0"),
        ({"due_ms": "abc"}, "due_ms must be an int of epoch ms"),
        ({"due_ms": -5}, "due_ms must be epoch ms from 0"),
        ({"due_ms": True}, "due_ms must be an int of epoch ms"),
        ({"attempt": 0}, "attempt must be an int from 1 to 2147483647, got 0"),
        ({"attempt": -3}, "attempt must be an int from 1 to 2147483647, got -3"),
        ({"attempt": True}, "attempt must be an int from 1 to 2147483647, got True"),
        ({"attempt": 1.0}, "attempt must be an int from 1"),
        # A forged header of 10**12 retries stayed `running` for good (hostile-headers probe).
        ({"attempt": 2**31}, "attempt must be an int from 1 to 2147483647, got 2147483648"),
        ({"attempt": 10**30}, "attempt must be an int from 1 to 2147483647"),
        # The history finds an entry by its JSON's start: an id JSON escapes is never found.
        ({"id": 'a"b'}, "id must hold no quote, backslash or control character"),
        ({"id": "a\\b"}, "id must hold no quote, backslash or control character"),
        ({"id": "a\nb"}, "id must hold no quote, backslash or control character"),
        ({"id": ""}, "id must be a non-empty string"),
        ({"id": 7}, "id must be a non-empty string"),
        ({"id": "x" * 201}, "id is 201 characters long"),
        ({"released_ms": 1.5}, "released_ms must be an int of epoch ms"),
        ({"started_ms": -1}, "started_ms must be epoch ms from 0"),
        ({"hold_ms": -1}, "hold_ms must be a duration in ms from 0"),
        ({"error": None}, "error must be a string"),
        ({"triggered": 1}, "triggered must be True or False"),
        ({"redelivered": "yes"}, "redelivered must be True or False"),
        ({"kind": "finished"}, "report kind must be one of"),
    ],
)
def test_a_report_with_an_unusable_field_is_refused_and_nothing_is_written(
    registered: Repeat, changes: dict[str, Any], message: str
) -> None:
    before = snapshot(registered)
    with pytest.raises(ScheduleError) as raised:
        registered.report([Report(**_fields(**changes))])
    assert message in str(raised.value)
    assert snapshot(registered) == before
    assert registered.get("q", "a") is not None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"queue": ""}, "queue must not be empty"),
        ({"queue": "a b"}, "queue 'a b' must not contain whitespace"),
        ({"name": "{a}"}, "registration name '{a}' must not contain '{'"),
        ({"name": ["a"]}, "registration name must be a string, got list"),
    ],
)
def test_a_report_with_an_invalid_name_is_refused_as_invalid_name(
    registered: Repeat, changes: dict[str, Any], message: str
) -> None:
    before = snapshot(registered)
    with pytest.raises(InvalidName, match=message.replace("{", r"\{").replace("}", r"\}")):
        registered.report([Report(**_fields(**changes))])
    assert snapshot(registered) == before


def test_a_whole_ms_report_is_applied_and_the_registration_still_reads_back(
    registered: Repeat,
) -> None:
    at_ms = int(time.time() * 1000)
    assert registered.report([Report(**_fields(at_ms=at_ms))]) == 1
    registration = registered.get("q", "a")
    assert registration is not None and registration.last_finished_ms == at_ms
    assert [r.name for r in registered.list("q")] == ["a"]
    [entry] = registered.history("q", "a")
    assert (entry.id, entry.finished_ms, entry.status) == (ID, at_ms, "succeeded")


def test_finished_drops_a_message_whose_due_time_is_unusable_with_one_log_line(
    registered: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    before = snapshot(registered)
    message = {"id": ID, "queue": "q", "name": "a", "due_ms": -5}
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        assert registered.finished(message, ok=True) is False  # never raises
    dropped = [r for r in caplog.records if "was dropped" in r.getMessage()]
    assert len(dropped) == 1 and "due_ms must be epoch ms from 0" in dropped[0].getMessage()
    assert snapshot(registered) == before


def _message(**options: Any) -> MessageProxy:
    return MessageProxy(
        Message(
            queue_name="q",
            actor_name="a",
            args=(),
            kwargs={},
            options=options,
            message_id=ID,
        )
    )


def test_a_dramatiq_message_with_a_negative_due_time_is_run_and_not_reported(
    registered: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    message = _message(**{OPTION_DUE_MS: -5, OPTION_NAME: "a", OPTION_QUEUE: "q"})
    with pytest.raises(ValueError, match="due_ms must be epoch ms from 0"):
        start_report(message, int(time.time() * 1000))  # its documented ValueError
    before = snapshot(registered)
    reporter = Reporter(registered, linger_s=0.0)
    outcomes = MessageOutcomes(lambda: reporter)
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        assert outcomes.started(message) == "run"  # the hook never raises: the actor runs
        outcomes.processed(message, None)
        outcomes.acked(message)
        assert reporter.flush(5.0)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and all("due_ms must be epoch ms" in r.getMessage() for r in warned)
    assert snapshot(registered) == before
    reporter.close()
