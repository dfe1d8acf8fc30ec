"""A template edited by hand to hold bytes that are not UTF-8 is a corrupt record: parked,
not sent altered (found by a probe of damaged registries, session 36).

docs/guarantees.md: payloads are valid UTF-8, and a record edited past the rules is parked
like any corrupt record. Bytes `\\xff\\xfe` in a template's string (whole, or in one of its
pieces, `template.2`) were decoded as U+FFFD: `show` printed them so, exit 0, and the pump
sent the changed payload without a word. Now the pump parks it with one line and sends
nothing of it, the others fire, `show` exits 1 naming it and `list` leaves it out. A real
server; a real CLI.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import redis

from emq_bridge import Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

WHOLE = b'{"args":["\xff\xfe"],"kwargs":{},"options":{},"task":"t.s"}'


def plant(client: redis.Redis, repeat: Repeat, where: str) -> None:
    """Break `bad`'s template: in its one field, or in its second piece."""
    record = repeat.keys("qx").record("bad")
    if where == "template":
        client.hset(record, "template", WHOLE)
    else:
        piece = client.hget(record, "template.2")
        assert piece is not None, client.hgetall(record)
        client.hset(record, "template.2", piece[:1] + b"\xff\xfe" + piece[1:])


@pytest.mark.parametrize("where", ["template", "template.2"])
def test_a_template_with_bytes_that_are_not_utf8_is_parked_not_sent(
    client: redis.Redis,
    redis_url: str,
    prefix: str,
    where: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(1_900_000_000_000)
    repeat = Repeat(client, prefix, clock=clock)
    args = ["x" * 100] if where == "template.2" else []  # over one piece: it is cut
    repeat.upsert("qx", "bad", every="1s", template={"task": "t.s", "args": args})
    repeat.upsert("qx", "ok", every="1s", template={"task": "t.ok"})
    plant(client, repeat, where)
    dispatcher = RecordingDispatcher()
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        for _ in range(3):
            clock.advance(1_000)
            Pump(repeat, ["qx"], dispatcher).run_once()
    assert {o.name for o in dispatcher.occurrences} == {"ok"}
    assert any("not valid UTF-8" in m and "bad" in m for m in caplog.messages), caplog.messages

    base = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    show = subprocess.run([*base, "show", "qx", "bad"], capture_output=True, text=True)
    assert show.returncode == 1, show.stdout
    assert "is corrupt" in show.stderr and "not valid UTF-8" in show.stderr, show.stderr
    listed = subprocess.run([*base, "list", "qx"], capture_output=True, text=True)
    assert listed.returncode == 0 and "bad" not in listed.stdout and "ok" in listed.stdout
