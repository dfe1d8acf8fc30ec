"""A record deleted by hand (`DEL`) leaves its registry member, which the pump parks, and is not
noticed by a sync's stamp: the next sync of the same file reads nothing. `emq-bridge remove`
clears what is left of it and, since its owner cannot be read, makes the next sync of every
source of the queue read in full, which creates it again. Before (session 27's probe), the
remove counted no write, the stamp held for good, and the schedule never came back."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner

from emq_bridge import Repeat

FILE = """queue = "q"
[[schedule]]
name = "kept"
task = "t"
every = "1h"

[[schedule]]
name = "deleted"
task = "t"
every = "1h"
"""


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def test_remove_of_a_deleted_record_makes_the_next_sync_create_it_again(
    run: Run, client: redis.Redis, repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(FILE)
    assert run("sync", str(path)).exit_code == 0
    client.delete(repeat.keys("q").record("deleted"))  # by hand: the member stays
    again = run("sync", str(path))
    assert again.exit_code == 0 and "nothing read" in again.stderr, again.output
    assert repeat.get("q", "deleted") is None  # the stamp held: not noticed (documented)
    assert run("remove", "q", "deleted").exit_code == 0
    full = run("sync", str(path))
    assert full.exit_code == 0 and "nothing read" not in full.stderr, full.output
    assert "+ q/deleted" in full.stdout, full.output
    assert sorted(repeat.names("q")) == ["deleted", "kept"]
    assert repeat.get("q", "deleted") is not None
