"""A sync that meets a record key of another type (`SET <record> x`, edited by hand) leaves
that one record as it is and writes the others, then says which in one line (exit 1, as a
corrupt record). Before (session 27's probe), `upsert.lua` failed on its first write midway
through its queue's call, after the items before it were written, and the sync exited 3 with
`upsert a, b, c: WRONGTYPE ... @user_script:241`, naming neither the registration nor the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner, one_error_line

from emq_bridge import Repeat, define
from emq_bridge.errors import CorruptRecord

FILE = """
[[schedule]]
queue = "a"
name = "n"
task = "t"
every = "1h"

[[schedule]]
queue = "b"
name = "m"
task = "t"
every = "1h"

[[schedule]]
queue = "b"
name = "n"
task = "t"
every = "1h"

[[schedule]]
queue = "b"
name = "o"
task = "t"
every = "1h"

[[schedule]]
queue = "c"
name = "n"
task = "t"
every = "1h"
"""


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def test_sync_writes_the_others_and_names_a_record_key_that_is_not_a_hash(
    run: Run, client: redis.Redis, repeat: Repeat, prefix: str, tmp_path: Path
) -> None:
    bad = f"{prefix}:{{b}}:repeat:n"
    client.set(bad, "x")
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    error = one_error_line(run("sync", str(path)), 1)
    assert "registration b/n is corrupt: the key is not a hash (WRONGTYPE)" in error, error
    assert "remove it (emq-bridge remove), then run this again" in error
    assert client.get(bad) == b"x"  # left as it was
    assert repeat.names("a") == ["n"] and repeat.names("c") == ["n"]
    assert sorted(repeat.names("b")) == ["m", "o"]  # its queue's other items too
    assert run("remove", "b", "n").exit_code == 0
    again = run("sync", str(path))
    assert again.exit_code == 0, again.output
    assert sorted(repeat.names("b")) == ["m", "n", "o"]


def test_upsert_many_raises_corrupt_record_naming_it(
    client: redis.Redis, repeat: Repeat, prefix: str
) -> None:
    client.set(f"{prefix}:{{q}}:repeat:bad", "x")
    hourly = define(every="1h", template={"task": "t"})
    with pytest.raises(CorruptRecord, match=r"^registration q/bad is corrupt: .*other 1 synced"):
        repeat.upsert_many([("q", "good", hourly), ("q", "bad", hourly)])
    assert repeat.names("q") == ["good"]
