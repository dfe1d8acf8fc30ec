"""Reads of a record edited by hand into a corrupt state, which a tester found harming more
than that record.

Before: `backfill` checked only a record's definition fields, so one corrupt in a run-state
field (`last_due_ms abc`) logged an error, then queued its slots and exited 0, where
`trigger` refuses it; and one record key that is not a hash made `list`, `export`,
`pause --all` and `resume --all` fail for its whole queue (exit 3, WRONGTYPE).

Now `backfill` refuses any record `trigger` refuses (exit 1, one line, nothing written), and
a record key that is not a hash is that record's corruption alone: `list` and `export` leave
it out with one line, `pause --all` and `resume --all` move the others and name it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner, one_error_line
from registry_state import snapshot

from emq_bridge import CorruptRecord, RegistryError, Repeat

from .cluster import Cluster

pytestmark = pytest.mark.faults

FROM, TO = "2026-01-01T00:00Z", "2026-01-01T05:00Z"  # six hourly slots, long past
NOT_A_HASH = "the key is not a hash (WRONGTYPE)"


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def hourly(run: Run, name: str) -> None:
    result = run("add", "reports", name, "--task", "t", "--every", "1h")
    assert result.exit_code == 0, result.output


def record(repeat: Repeat, name: str) -> str:
    return repeat.keys("reports").record(name)


def not_a_hash(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.set(key, "x")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- 1. backfill refuses what trigger refuses ------------------------------------------------


@pytest.mark.parametrize("field", ["last_due_ms", "fired", "created_ms"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["", "dry"])
def test_backfill_refuses_a_record_corrupt_in_a_run_state_field_and_writes_nothing(
    run: Run, repeat: Repeat, client: redis.Redis, field: str, dry_run: bool
) -> None:
    hourly(run, "d")
    client.hset(record(repeat, "d"), field, "abc")
    before = snapshot(repeat)

    command = ("backfill", "reports", "d", "--from", FROM, "--to", TO)
    line = one_error_line(run(*command, *(("--dry-run",) if dry_run else ())), 1)

    assert f"registration reports/d is corrupt: {field} 'abc' is not an integer" in line
    assert snapshot(repeat) == before
    assert not client.exists(repeat.keys("reports").leases)
    assert not client.exists(repeat.keys("reports").backfilled("d"))
    assert one_error_line(run("trigger", "reports", "d"), 1) == line  # the same refusal
    with pytest.raises(CorruptRecord, match="reports/d is corrupt"):
        repeat.backfill("reports", "d", FROM, TO, rate=0)
    assert snapshot(repeat) == before


def test_backfill_of_a_sound_record_still_queues_its_slots(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run, "d")
    result = run("backfill", "reports", "d", "--from", FROM, "--to", TO, "--rate", "0")
    assert result.exit_code == 0, result.output
    assert "queued 6 slot(s)" in result.output and not result.stderr
    assert client.zcard(repeat.keys("reports").leases) == 6


# -- 2. a record key that is not a hash harms only itself ------------------------------------


@pytest.fixture
def one_not_a_hash(run: Run, repeat: Repeat, client: redis.Redis) -> None:
    for name in ("bad", "ok"):
        hourly(run, name)
    not_a_hash(client, record(repeat, "bad"))


@pytest.mark.usefixtures("one_not_a_hash")
def test_list_leaves_a_record_key_that_is_not_a_hash_out_with_one_line(
    run: Run, repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        listed = run("list")
        as_json = run("list", "--json")

    assert listed.exit_code == 0, listed.output
    assert "ok" in listed.stdout and "bad" not in listed.stdout
    assert as_json.exit_code == 0, as_json.output
    assert [r["name"] for r in json.loads(as_json.stdout)] == ["ok"]
    assert warnings_of(caplog) == [f"corrupt registration reports/bad skipped: {NOT_A_HASH}"] * 2
    # The API reads: the others are read, the broken one is named as corrupt.
    assert [r.name for r in repeat.list("reports")] == ["ok"]
    assert [r.name for r in repeat.iter_list("reports")] == ["ok"]
    assert repeat.get("reports", "bad") is None
    assert list(repeat.get_many("reports", ["bad", "ok"])) == ["ok"]
    rows = {name: (found, error) for found, name, _, error in repeat.iter_checked("reports")}
    assert rows["bad"] == (None, NOT_A_HASH) and rows["ok"][0] is not None


@pytest.mark.usefixtures("one_not_a_hash")
def test_export_leaves_a_record_key_that_is_not_a_hash_out_and_says_so(
    run: Run, tmp_path: Path
) -> None:
    out = tmp_path / "x.toml"

    result = run("export", "-o", str(out))

    assert result.exit_code == 0, result.output
    assert f"! reports/bad: its record is corrupt: {NOT_A_HASH}" in result.stderr
    assert "exported 1 schedule(s), 1 left out" in result.stderr
    assert 'name = "ok"' in out.read_text() and 'name = "bad"' not in out.read_text()


@pytest.mark.usefixtures("one_not_a_hash")
def test_pause_all_and_resume_all_move_the_others_and_name_a_record_key_that_is_not_a_hash(
    run: Run, repeat: Repeat, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        paused = run("pause", "reports", "--all")

    assert paused.exit_code == 0, paused.output
    assert paused.stdout.split() == ["paused", "1", "in", "reports", "ok"]
    assert repeat.read("reports", "ok").paused
    assert client.get(record(repeat, "bad")) == b"x"  # left as it was
    assert warnings_of(caplog) == [
        f"reports/bad left as it is, not paused: {NOT_A_HASH}; remove it, then add it again"
    ]
    caplog.clear()

    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        resumed = run("resume", "reports", "--all")

    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout.split() == ["resumed", "1", "in", "reports", "ok"]
    assert not repeat.read("reports", "ok").paused
    assert warnings_of(caplog) == [
        f"reports/bad left as it is, not resumed: {NOT_A_HASH}; remove it, then add it again"
    ]
    # The way out the line gives works.
    assert run("remove", "reports", "bad").exit_code == 0
    hourly(run, "bad")
    assert [r.name for r in repeat.list("reports")] == ["bad", "ok"]


def test_a_registry_key_of_another_type_still_fails_the_read(
    repeat: Repeat, client: redis.Redis
) -> None:
    repeat.register("reports", "d", every="1h", template={"task": "t"})
    not_a_hash(client, repeat.keys("reports").registry)
    # Not one record's corruption: the whole queue is broken, and its reads say so.
    with pytest.raises(RegistryError, match="WRONGTYPE"):
        repeat.get("reports", "d")
    with pytest.raises(RegistryError, match="WRONGTYPE"):
        repeat.get_many("reports", ["d"])


def test_through_redis_cluster_a_record_key_that_is_not_a_hash_is_left_out_alone(
    cluster: Cluster,
) -> None:
    client = cluster.client()
    repeat = Repeat(client, "s27")
    for name in ("bad", "ok"):
        repeat.register("reports", name, every="1h", template={"task": "t"})
    not_a_hash(client, record(repeat, "bad"))

    assert [r.name for r in repeat.list("reports")] == ["ok"]
    assert repeat.pause_all("reports") == ["ok"]
    assert repeat.resume_all("reports") == ["ok"]
    not_a_hash(client, repeat.keys("reports").registry)
    with pytest.raises(RegistryError, match="WRONGTYPE"):
        repeat.get("reports", "ok")
