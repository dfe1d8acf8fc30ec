"""A record edited by hand into a corrupt state, which an operator could pause but then not
resume, with advice that did not work.

Before: `pause` paused it silently; `resume` exited 1 with `(replace or remove it)`, but
`add --replace` of the same definition printed `unchanged` and left it corrupt (an edit by
hand keeps the stored digest), so the operator was stuck; a run-state field edited to garbage
was reported as `invalid literal for int() with base 10: 'xyz'`, naming no field; and
`pause --all` left a corrupt record running, logging it as skipped, although one corrupt in
a field the pump does not read still fires.

Now the moves that stop a schedule work on any record (`pause`, `pause --all`, `remove`),
`pause` warns that `resume` will refuse it, and `resume` and `add --replace` refuse it in one
line (exit 1, nothing written by `resume`) naming the field and the way out: `remove`, then
add it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis
from cli_runs import Run, cli_runner, one_error_line
from registry_state import snapshot

from emq_bridge import CorruptRecord, Pump, Repeat
from emq_bridge.testing import RecordingDispatcher

WAY_OUT = "run `emq-bridge remove reports d`, then add it again or sync its file"


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def hourly(run: Run, name: str = "d", every: str = "1h") -> None:
    result = run("add", "reports", name, "--task", "t", "--every", every)
    assert result.exit_code == 0, result.output


Corrupt = Callable[[redis.Redis, str], None]


def field(name: str, value: str) -> Corrupt:
    return lambda client, key: client.hset(key, name, value)  # type: ignore[return-value]


def deleted(name: str) -> Corrupt:
    return lambda client, key: client.hdel(key, name)  # type: ignore[return-value]


# (how the record is edited, the text that names the field in every message)
CORRUPTIONS: dict[str, tuple[Corrupt, str]] = {
    "every_ms not an integer": (field("every_ms", "abc"), "every_ms 'abc' is not an integer"),
    "template not JSON": (field("template", "{nope"), "record template is not JSON"),
    "template missing": (deleted("template"), "record has no template"),
    "cadence missing": (deleted("every_ms"), "record has neither every_ms nor cron"),
    "last_due_ms not an integer": (
        field("last_due_ms", "xyz"),
        "last_due_ms 'xyz' is not an integer",
    ),
    "created_ms not an integer": (field("created_ms", "xyz"), "created_ms 'xyz' is not an integer"),
}


def record(repeat: Repeat, name: str = "d") -> str:
    return repeat.keys("reports").record(name)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_a_corrupt_record_pauses_with_a_warning_and_resume_names_the_field_and_the_way_out(
    run: Run, repeat: Repeat, client: redis.Redis, corruption: str
) -> None:
    hourly(run)
    corrupt, named = CORRUPTIONS[corruption]
    corrupt(client, record(repeat))

    paused = run("pause", "reports", "d", "--note", "investigating")

    assert paused.exit_code == 0, paused.output
    assert paused.stdout.strip() == "paused reports/d"
    warning = paused.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: registration reports/d is corrupt")
    assert named in warning[0] and "resume refuses it" in warning[0] and WAY_OUT in warning[0]
    assert client.hget(record(repeat), "paused") == b"1"
    assert client.zscore(repeat.keys("reports").registry, "d") == float("inf")

    before = snapshot(repeat)
    for command in (("resume", "reports", "d"), ("resume", "reports", "d", "--catchup")):
        line = one_error_line(run(*command), 1)
        assert f"registration reports/d is corrupt: {named}" in line
        assert "resume refuses it (nothing written)" in line and WAY_OUT in line
        assert snapshot(repeat) == before

    # The way out it names works, and leaves a schedule that pauses and resumes again.
    assert run("remove", "reports", "d").exit_code == 0
    hourly(run)
    assert run("pause", "reports", "d").stderr == ""
    resumed = run("resume", "reports", "d")
    assert resumed.exit_code == 0 and resumed.stdout.strip() == "resumed reports/d"


def test_a_paused_record_corrupted_in_its_parked_next_run_is_named_by_that_field(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run)
    assert run("pause", "reports", "d").exit_code == 0
    client.hset(record(repeat), "paused_next_ms", "xyz")
    before = snapshot(repeat)

    again = run("pause", "reports", "d")
    assert again.stdout.strip() == "reports/d was already paused"
    assert "paused_next_ms 'xyz' is not a number" in again.stderr
    line = one_error_line(run("resume", "reports", "d"), 1)

    assert "registration reports/d is corrupt: paused_next_ms 'xyz' is not a number" in line
    assert WAY_OUT in line
    assert snapshot(repeat) == before
    with pytest.raises(CorruptRecord, match="paused_next_ms 'xyz' is not a number"):
        repeat.resume("reports", "d")
    assert snapshot(repeat) == before


def test_add_replace_of_the_same_definition_does_not_call_a_corrupt_record_unchanged(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run)
    client.hset(record(repeat), "every_ms", "abc")
    before = snapshot(repeat)

    result = run("add", "reports", "d", "--task", "t", "--every", "1h", "--replace")

    line = one_error_line(result, 1)
    assert "registration reports/d is corrupt: every_ms 'abc' is not an integer" in line
    assert "--replace left it corrupt (nothing written)" in line and WAY_OUT in line
    assert "unchanged" not in result.stdout
    assert snapshot(repeat) == before


def test_add_replace_that_rewrites_the_definition_but_not_a_corrupt_run_state_says_so(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run)
    client.hset(record(repeat), "last_due_ms", "xyz")

    result = run("add", "reports", "d", "--task", "t", "--every", "30m", "--replace")

    line = one_error_line(result, 1)
    assert "last_due_ms 'xyz' is not an integer" in line
    assert "--replace left it corrupt (its definition updated)" in line and WAY_OUT in line


def test_pause_all_pauses_a_corrupt_record_with_the_others_and_logs_it(
    run: Run, repeat: Repeat, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    hourly(run)
    hourly(run, "ok")
    client.hset(record(repeat), "created_ms", "xyz")  # the pump still fires it

    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        result = run("pause", "reports", "--all")

    assert result.exit_code == 0, result.output
    assert sorted(result.stdout.split()[4:]) == ["d", "ok"]
    assert client.hget(record(repeat), "paused") == b"1"
    assert client.zscore(repeat.keys("reports").registry, "d") == float("inf")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "paused reports/d, whose record is corrupt: created_ms 'xyz' is not an integer; "
        "resume refuses it until it is removed and added again"
    ]
    # `--source` chooses a corrupt record by its raw owner field, as resume_all does.
    assert repeat.pause_all("reports", source="nobody") == []

    line = one_error_line(run("resume", "reports", "--all"), 1)
    assert "d: created_ms 'xyz' is not an integer" in line
    assert "run `emq-bridge remove reports NAME`, then add it again" in line
    assert not repeat.read("reports", "ok").paused


def test_a_paused_record_corrupt_in_a_field_the_pump_does_not_read_stops_firing(
    run: Run, repeat: Repeat, client: redis.Redis
) -> None:
    hourly(run)
    client.hset(record(repeat), "created_ms", "xyz")
    registry = repeat.keys("reports").registry
    client.zadd(registry, {"d": 1_000})  # due long ago
    worker = RecordingDispatcher()
    Pump(repeat, ["reports"], worker).run_once()
    assert len(worker.clear()) == 1  # corrupt to `show`, yet the pump fires it: pause must work

    client.zadd(registry, {"d": 1_000})
    assert run("pause", "reports", "d").exit_code == 0
    Pump(repeat, ["reports"], worker).run_once()

    assert worker.clear() == []
    assert client.zscore(registry, "d") == float("inf")
