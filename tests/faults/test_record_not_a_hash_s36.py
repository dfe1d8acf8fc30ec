"""A record key of another type is that record's corruption, said as such by the commands
that name it (found by a probe of damaged registries, session 36).

design.md: a record key of another type is that record's corruption alone; `list` leaves it
out naming it. `show`, `history`, `next` and `resume` of it exited 3 with "Redis ...
refused: read qa/a3: ... WRONGTYPE", which reads as a server problem to retry. They exit 1
now, "registration qa/a3 is corrupt: the key is not a hash (WRONGTYPE)", as for a field that
cannot be decoded, and `remove` still removes it. A real server; a real CLI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from emq_bridge import Repeat


@pytest.mark.parametrize(
    "argv",
    [["show", "qa", "a3"], ["history", "qa", "a3"], ["next", "qa", "a3"], ["resume", "qa", "a3"]],
)
def test_a_record_key_of_another_type_is_named_corrupt_exit_1(
    client: redis.Redis, redis_url: str, prefix: str, argv: list[str]
) -> None:
    repeat = Repeat(client, prefix)
    repeat.upsert("qa", "a3", every="1h", template={"task": "t"})
    record = repeat.keys("qa").record("a3")
    client.delete(record)
    client.set(record, "x")
    base = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    done = subprocess.run([*base, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "registration qa/a3 is corrupt: the key is not a hash (WRONGTYPE)" in line, line
    removed = subprocess.run([*base, "remove", "qa", "a3"], capture_output=True, text=True)
    assert removed.returncode == 0, removed.stderr
    assert not client.exists(record)


def test_a_hand_edit_that_decodes_is_kept_by_sync(
    client: redis.Redis, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    # What docs/schedules-and-cli.md says of it (a probe of damaged registries found it):
    # a sync compares digests, and the edit left the stored one as it was.
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(
        'source = "ops"\n[[schedule]]\nqueue = "qa"\nname = "a3"\ntask = "t"\nevery = "1s"\n'
    )
    base = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix]
    first = subprocess.run([*base, "sync", str(schedules)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    repeat = Repeat(client, prefix)
    client.hset(repeat.keys("qa").record("a3"), "every_ms", "60000")
    schedules.write_text(schedules.read_text() + "\n")  # a new file: the sync reads the registry
    again = subprocess.run([*base, "sync", str(schedules)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "1 unchanged" in again.stderr, again.stderr
    found = repeat.get("qa", "a3")
    assert found is not None and found.definition.cadence.describe() == "every 1m"
