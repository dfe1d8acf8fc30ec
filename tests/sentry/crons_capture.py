"""sentry-sdk's transport interface, writing instead of sending: the test processes' capture.

`init()` starts sentry-sdk as an app would, with the given integrations, and every envelope
item it sends is appended to `$SENTRY_ENVELOPES` as one JSON line.
"""

from __future__ import annotations

import json
import os
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport


class FileTransport(Transport):
    """One JSON line per envelope item: its type, its payload and the process that sent it."""

    def capture_envelope(self, envelope: Envelope) -> None:
        with open(os.environ["SENTRY_ENVELOPES"], "a", encoding="utf-8") as out:
            for item in envelope.items:
                line = {"type": item.type, "payload": item.payload.json, "pid": os.getpid()}
                out.write(json.dumps(line, default=str) + "\n")


def init(integrations: list[Any]) -> None:
    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1",  # never reached: the transport writes a file
        transport=FileTransport,
        integrations=integrations,
        default_integrations=False,
        auto_enabling_integrations=False,
        environment="test",
        release="emq-test@1",
    )
