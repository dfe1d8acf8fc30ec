"""Registry moves on keys edited by hand, which a tester found writing half a move or
blaming the wrong thing.

A key of another type is corruption: the move fails before it writes anything (a backfill
that marked a slot done and then failed on its lease lost that slot for good; a failed
`remove` removed the schedule; a failed `add` left a record without its registry member).
A record that cannot be decoded is refused by `trigger` (whose occurrence a pump would only
drop) and named as corrupt by `show`, `history`, `next`, `resume` and `backfill`: one line,
exit 1, where they said "no registration". `resume --all` resumes the others and exits 1
naming those it left paused; `list` and `export` fail on a registry key of another type
instead of leaving that queue out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from cli_runs import Run, cli_runner, one_error_line
from registry_state import snapshot

from emq_bridge import CorruptRecord, RegistryError, Repeat

FROM, TO = "2026-01-01T00:00Z", "2026-01-01T05:00Z"  # six hourly slots, long past


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def hourly(run: Run, name: str = "d") -> None:
    assert run("add", "reports", name, "--task", "t", "--every", "1h").exit_code == 0


def plant(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.set(key, "x")


# -- 1. a failed backfill loses no slot ------------------------------------------------------


@pytest.mark.parametrize("broken", ["leases", "backfill"])
def test_a_backfill_failing_on_a_key_of_another_type_marks_no_slot_and_a_retry_sends_them_all(
    run: Run, repeat: Repeat, client: redis.Redis, broken: str
) -> None:
    hourly(run)
    keys = repeat.keys("reports")
    key = keys.leases if broken == "leases" else keys.backfilled("d")
    plant(client, key)
    before = snapshot(repeat)

    line = one_error_line(run("backfill", "reports", "d", "--from", FROM, "--to", TO), 3)

    assert "WRONGTYPE" in line and key in line
    assert snapshot(repeat) == before
    client.delete(key)
    again = run("backfill", "reports", "d", "--from", FROM, "--to", TO, "--rate", "0")
    assert again.exit_code == 0, again.output
    assert "queued 6 slot(s)" in again.output and "0 backfilled before" in again.output
    assert client.zcard(keys.leases) == 6


# -- 2. trigger refuses what show refuses, and writes nothing --------------------------------


def test_trigger_refuses_a_corrupt_record_in_one_line_and_writes_no_pending_occurrence(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run)
    client.hset(repeat.keys("reports").record("d"), "every_ms", "garbage")
    before = snapshot(repeat)

    line = one_error_line(run("trigger", "reports", "d"), 1)

    assert "reports/d is corrupt" in line and "every_ms" in line
    assert snapshot(repeat) == before
    with pytest.raises(CorruptRecord):
        repeat.trigger("reports", "d")
    assert not client.exists(repeat.keys("reports").leases)


@pytest.mark.parametrize("broken", ["record", "leases"])
def test_trigger_onto_a_key_of_another_type_fails_and_writes_nothing(
    run: Run, repeat: Repeat, client: redis.Redis, broken: str
) -> None:
    hourly(run)
    keys = repeat.keys("reports")
    plant(client, keys.record("d") if broken == "record" else keys.leases)
    before = snapshot(repeat)

    # A record of another type is that record's corruption (exit 1, since session 36); a
    # queue's key of another type is Redis refusing the move (exit 3).
    line = one_error_line(run("trigger", "reports", "d"), 1 if broken == "record" else 3)

    assert "WRONGTYPE" in line
    if broken == "record":
        assert "registration reports/d is corrupt: the key is not a hash" in line
    assert snapshot(repeat) == before


# -- 3. a corrupt record is called corrupt, in one line --------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("show", "reports", "d"),
        ("history", "reports", "d"),
        ("next", "reports", "d"),
        ("resume", "reports", "d"),
        ("resume", "reports", "d", "--catchup"),
        ("backfill", "reports", "d", "--from", FROM, "--to", TO),
    ],
    ids=lambda c: " ".join(c[:1] + c[3:4]),
)
def test_a_command_on_a_corrupt_record_says_it_is_corrupt_in_one_line(
    run: Run, repeat: Repeat, client: redis.Redis, command: tuple[str, ...]
) -> None:
    hourly(run)
    assert run("pause", "reports", "d").exit_code == 0
    client.hset(repeat.keys("reports").record("d"), "every_ms", "garbage")
    before = snapshot(repeat)

    line = one_error_line(run(*command), 1)

    assert "registration reports/d is corrupt: every_ms 'garbage'" in line
    assert "no registration" not in line
    assert snapshot(repeat) == before


def test_the_api_reads_of_one_name_raise_corrupt_record_where_get_returns_none(
    repeat: Repeat, client: redis.Redis
) -> None:
    repeat.register("reports", "d", every="1h", template={"task": "t"})
    client.hset(repeat.keys("reports").record("d"), "every_ms", "garbage")
    assert repeat.get("reports", "d") is None
    for read in (
        lambda: repeat.read("reports", "d"),
        lambda: repeat.next_runs("reports", "d", 3),
        lambda: repeat.resume("reports", "d"),
    ):
        with pytest.raises(CorruptRecord, match="reports/d is corrupt"):
            read()
    with pytest.raises(KeyError):
        repeat.read("reports", "missing")


def test_resume_all_resumes_the_others_and_exits_1_naming_the_corrupt_one(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    for name in ("d", "ok"):
        hourly(run, name)
    assert run("pause", "reports", "--all").exit_code == 0
    client.hset(repeat.keys("reports").record("d"), "every_ms", "garbage")

    result = run("resume", "reports", "--all")

    line = one_error_line(result, 1)
    assert "1 paused registration(s) left paused" in line and "d: every_ms 'garbage'" in line
    assert result.stdout.split() == ["resumed", "1", "in", "reports", "ok"]
    assert client.hget(repeat.keys("reports").record("d"), "paused") == b"1"
    assert not repeat.read("reports", "ok").paused


# -- 5. list and export do not leave a broken queue out ---------------------------------------


def test_list_and_export_fail_on_a_registry_key_of_another_type_and_write_no_file(
    run: Run, repeat: Repeat, client: redis.Redis, tmp_path: Path
) -> None:
    hourly(run)
    assert run("add", "other", "o", "--task", "t", "--every", "1h").exit_code == 0
    plant(client, repeat.keys("reports").registry)
    # A listing of everything sees the broken queue; pumps, syncs and health do not stop on it.
    assert repeat.queues(broken=True) == ["other", "reports"]
    assert repeat.queues() == ["other"]
    schedules = tmp_path / "s.toml"
    schedules.write_text(
        'source = "s"\nqueue = "other"\n\n[[schedule]]\nname = "f"\ntask = "t"\nevery = "1h"\n'
    )
    synced = run("sync", str(schedules))  # it prunes, reading every queue: not the broken one
    assert synced.exit_code == 0, synced.output

    assert "list reports: WRONGTYPE" in one_error_line(run("list"), 3)
    out = tmp_path / "x.toml"
    assert "reports" in one_error_line(run("export", "-o", str(out)), 3)
    assert not out.exists()


# -- 7. remove, add and add --replace write nothing when they fail ---------------------------


@pytest.mark.parametrize("broken", ["leases", "running", "synced"])
def test_remove_failing_on_a_key_of_another_type_keeps_the_schedule(
    run: Run, repeat: Repeat, client: redis.Redis, broken: str
) -> None:
    hourly(run)
    keys = repeat.keys("reports")
    plant(client, getattr(keys, broken))
    before = snapshot(repeat)

    assert "WRONGTYPE" in one_error_line(run("remove", "reports", "d"), 3)

    assert snapshot(repeat) == before
    client.delete(getattr(keys, broken))
    assert run("remove", "reports", "d").exit_code == 0
    assert not client.exists(keys.record("d"), keys.registry)


def test_add_onto_a_registry_of_another_type_leaves_no_record_behind(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    keys = repeat.keys("reports")
    plant(client, keys.registry)

    one_error_line(run("add", "reports", "d", "--task", "t", "--every", "1h"), 3)

    assert not client.exists(keys.record("d"))
    client.delete(keys.registry)
    hourly(run)  # not "already exists"


def test_add_replace_with_a_stamps_key_of_another_type_rewrites_nothing(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run)
    plant(client, repeat.keys("reports").synced)
    before = snapshot(repeat)

    result = run("add", "reports", "d", "--task", "t2", "--every", "2h", "--replace")

    assert "WRONGTYPE" in one_error_line(result, 3)
    assert snapshot(repeat) == before


def test_the_api_moves_raise_registry_error_on_a_key_of_another_type(
    repeat: Repeat, client: redis.Redis
) -> None:
    repeat.register("reports", "d", every="1h", template={"task": "t"})
    plant(client, repeat.keys("reports").leases)
    before = snapshot(repeat)
    for move in (
        lambda: repeat.cancel("reports", "d"),
        lambda: repeat.trigger("reports", "d"),
        lambda: repeat.backfill("reports", "d", FROM, TO),
    ):
        with pytest.raises(RegistryError, match="WRONGTYPE"):
            move()
    assert snapshot(repeat) == before


# -- 4. pump --list-key names a key of another type ------------------------------------------


def test_pump_refuses_a_list_key_of_another_type_before_taking_anything(
    run: Run, repeat: Repeat, client: redis.Redis, prefix: str
) -> None:
    hourly(run)
    assert run("trigger", "reports", "d").exit_code == 0
    target = f"{prefix}:not-a-list"
    client.hset(target, "f", "v")
    before = snapshot(repeat)

    line = one_error_line(run("pump", "reports", "--list-key", target, "--once"), 2)

    assert f"{target!r} holds a hash, not a list" in line
    assert snapshot(repeat) == before  # the triggered occurrence still waits for a pump
    client.delete(target)
    assert run("pump", "reports", "--list-key", target, "--once").exit_code == 0
    assert client.llen(target) == 1
    client.delete(target)


def test_export_lists_a_corrupt_record_as_left_out_instead_of_dropping_it(
    run: Run, client: redis.Redis, repeat: Repeat, tmp_path: Path
) -> None:
    hourly(run, "d")
    hourly(run, "ok")
    client.hset(repeat.keys("reports").record("d"), "every_ms", "garbage")
    out = tmp_path / "x.toml"

    result = run("export", "-o", str(out))

    assert result.exit_code == 0, result.output
    assert "! reports/d: its record is corrupt: every_ms 'garbage'" in result.stderr
    assert "exported 1 schedule(s), 1 left out" in result.stderr
    assert 'name = "ok"' in out.read_text() and 'name = "d"' not in out.read_text()
