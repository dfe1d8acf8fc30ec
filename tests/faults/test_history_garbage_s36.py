"""History entries edited into arrays of other types are left out with one line, not a
traceback (found by a probe of damaged registries, session 36).

`emq-bridge history` met `[1, 2, ..., 10]` with `AttributeError: 'int' object has no
attribute 'isprintable'` and an array nested 3,000 deep with `RecursionError` (exit 1, a
traceback; the web view's schedule page answered 500). Such entries are left out now, logged
as unreadable, and the others are shown. A real server; a real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys

import redis

from emq_bridge import Repeat, occurrence_id

GARBAGE = [
    json.dumps(list(range(1, 11))),
    "[" * 3_000 + "]" * 3_000,
    json.dumps(["id", 1, "", "", "", "no-such-status", 1, 0, 0, ""]),
    json.dumps(["id", 1, "", "", "", "failed", 1, 0, 0, {"error": "an object"}]),
]


def test_garbage_history_entries_are_left_out_and_the_others_shown(
    client: redis.Redis, redis_url: str, prefix: str
) -> None:
    repeat = Repeat(client, prefix)
    repeat.upsert("qa", "a3", every="1h", template={"task": "t"})
    due = 1_900_000_000_000
    ident = occurrence_id(prefix, "qa", "a3", due)
    good = json.dumps([ident, due, "", "", "", "lost", 1, 0, 0, ""])
    client.rpush(repeat.keys("qa").history("a3"), good, *GARBAGE)
    assert [e.due_ms for e in repeat.history("qa", "a3")] == [due]
    base = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [*base, "history", "qa", "a3", *extra], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert "lost" in done.stdout
        assert done.stderr.count("a history entry is unreadable, skipped") == len(GARBAGE)
