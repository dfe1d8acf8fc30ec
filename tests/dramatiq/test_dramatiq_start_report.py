"""`outcomes.start_report`: the `started` report a worker builds before each message, read
in one pass from the message's options, is the one `report_of` makes of the same occurrence."""

from __future__ import annotations

from typing import Any

import pytest
from dramatiq import Message
from dramatiq.broker import MessageProxy

from emq_bridge import InvalidName, Report
from emq_bridge.dramatiq.outcomes import start_report
from emq_bridge.dramatiq.schedule import (
    OPTION_DUE_MS,
    OPTION_NAME,
    OPTION_QUEUE,
    OPTION_REDELIVERED,
    OPTION_RELEASED_MS,
    OPTION_TRIGGERED,
)
from emq_bridge.lifecycle import report_of

AT_MS = 1_800_000_000_123


def _message(**options: Any) -> MessageProxy:
    return MessageProxy(
        Message(
            queue_name="reports",
            actor_name="digest",
            args=(),
            kwargs={},
            options=options,
            message_id="0b6cf1a2-6f0e-4b8e-9d7e-1f2a3b4c5d6e",
        )
    )


@pytest.mark.parametrize(
    "options",
    [
        {OPTION_DUE_MS: 1_800_000_000_000, OPTION_NAME: "digest", OPTION_QUEUE: "reports"},
        {
            OPTION_DUE_MS: "1800000000000",
            OPTION_NAME: "digest",
            OPTION_QUEUE: "registry-queue",
            OPTION_RELEASED_MS: 1_800_000_000_050,
            OPTION_REDELIVERED: True,
            OPTION_TRIGGERED: True,
            "retries": 2,
        },
        {OPTION_DUE_MS: 1_800_000_000_000, OPTION_NAME: "digest", OPTION_RELEASED_MS: ""},
    ],
)
def test_the_start_report_is_the_one_report_of_makes_of_the_same_occurrence(
    options: dict[str, Any],
) -> None:
    message = _message(**options)
    retries = options.get("retries", 0)
    expected = report_of(
        "started",
        {
            "id": message.message_id,
            "queue": options.get(OPTION_QUEUE) or message.queue_name,
            "name": options[OPTION_NAME],
            "due_ms": options[OPTION_DUE_MS],
            "released_ms": options.get(OPTION_RELEASED_MS),
            "redelivered": options.get(OPTION_REDELIVERED, False),
            "triggered": options.get(OPTION_TRIGGERED, False),
        },
        attempt=retries + 1,
        at_ms=AT_MS,
    )
    assert start_report(message, AT_MS) == expected
    assert isinstance(expected, Report) and expected.attempt == retries + 1


def test_a_message_emq_bridge_did_not_send_has_no_start_report() -> None:
    assert start_report(_message(), AT_MS) is None
    assert start_report(object(), AT_MS) is None


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({OPTION_DUE_MS: "soon", OPTION_NAME: "digest"}, ValueError),
        ({OPTION_DUE_MS: 1, OPTION_NAME: "digest", OPTION_RELEASED_MS: [1]}, ValueError),
        ({OPTION_DUE_MS: 1, OPTION_NAME: "two words"}, InvalidName),
        ({OPTION_DUE_MS: 1}, InvalidName),
    ],
)
def test_garbled_options_are_refused_with_an_error(
    options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        start_report(_message(**options), AT_MS)
