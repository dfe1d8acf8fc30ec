"""Pause with a note, bulk pause/resume by queue or source, and resume(catchup=True)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from click.testing import CliRunner, Result

from emq_bridge import Repeat, ScheduleError
from emq_bridge.cli import cli
from emq_bridge.definition import define
from emq_bridge.testing import ManualClock, RecordingDispatcher, manual_pump

HOUR = 3_600_000
T0 = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
TEMPLATE = {"task": "t"}

Run = Callable[..., Result]


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args], **kwargs)

    return invoke


def test_a_pause_keeps_its_note_author_and_instant_until_resumed(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    assert any_repeat.pause("reports", "digest", note="relay down", by="alice", now_ms=T0 + 5)
    # Pausing again changes nothing, the first note stays.
    assert not any_repeat.pause("reports", "digest", note="other", by="bob", now_ms=T0 + 9)
    registration = any_repeat.get("reports", "digest")
    assert registration is not None
    assert (registration.paused_note, registration.paused_by, registration.paused_ms) == (
        "relay down",
        "alice",
        T0 + 5,
    )
    assert any_repeat.resume("reports", "digest", now_ms=T0 + 10)
    registration = any_repeat.get("reports", "digest")
    assert registration is not None and not registration.paused
    assert (registration.paused_note, registration.paused_by, registration.paused_ms) == (
        None,
        None,
        None,
    )
    fields = any_repeat.client.hgetall(any_repeat.keys("reports").record("digest"))
    assert not {b"paused_note", b"paused_by", b"paused_ms"} & set(fields)


def test_a_bad_note_is_refused_and_changes_nothing(repeat: Repeat) -> None:
    repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    with pytest.raises(ScheduleError, match="limit is 500"):
        repeat.pause("reports", "digest", note="x" * 501)
    registration = repeat.get("reports", "digest")
    assert registration is not None and not registration.paused


def test_bulk_pause_and_resume_by_source_leave_the_others_alone(repeat: Repeat) -> None:
    one = define(every="1h", template=TEMPLATE)
    repeat.upsert_many([("reports", "a", one), ("reports", "b", one)], source="billing", now_ms=T0)
    repeat.upsert("reports", "c", definition=one, source="ops", now_ms=T0)
    repeat.register("reports", "d", definition=one, now_ms=T0)
    assert repeat.pause_all("reports", source="billing", note="freeze", by="ci") == ["a", "b"]
    assert {r.name for r in repeat.list("reports") if r.paused} == {"a", "b"}
    assert repeat.pause_all("reports", note="all") == ["c", "d"]  # a, b already paused
    assert repeat.resume_all("reports", source="billing", now_ms=T0 + 1) == ["a", "b"]
    assert {r.name for r in repeat.list("reports") if r.paused} == {"c", "d"}
    assert repeat.resume_all("reports", now_ms=T0 + 1) == ["c", "d"]


def test_bulk_resume_leaves_a_parked_registration_parked(repeat: Repeat) -> None:
    repeat.register("reports", "bad", every="1h", template=TEMPLATE, now_ms=T0)
    repeat.register("reports", "ok", every="1h", template=TEMPLATE, now_ms=T0)
    template = repeat.load_records("reports", ["bad"], ["template"])["bad"]["template"]
    repeat.park(
        "reports", "bad", [], deadline_ms=T0, template=template, reason="unknown task", now_ms=T0
    )
    repeat.pause("reports", "ok")
    assert repeat.resume_all("reports", now_ms=T0) == ["ok"]
    bad = repeat.get("reports", "bad")
    assert bad is not None and bad.paused and bad.parked_reason == "unknown task"


@pytest.mark.parametrize(
    ("policy", "catchup", "fired", "missed"),
    [
        ("latest", False, [T0 + 6 * HOUR], 0),  # today's resume: the next future slot
        ("latest", True, [T0 + 5 * HOUR, T0 + 6 * HOUR], 3),  # newest of the paused window
        ("all", True, [T0 + k * HOUR for k in (2, 3, 4, 5, 6)], 0),
        ("skip", True, [T0 + 6 * HOUR], 4),
    ],
)
def test_resume_with_catchup_hands_the_paused_window_to_the_misfire_policy(
    any_repeat: Repeat, policy: str, catchup: bool, fired: list[int], missed: int
) -> None:
    definition = define(every="1h", misfire=policy, template=TEMPLATE)  # type: ignore[arg-type]
    any_repeat.register("reports", "r", definition=definition, now_ms=T0)
    clock = ManualClock(T0 + HOUR)
    recorder = RecordingDispatcher()
    pump = manual_pump(any_repeat, ["reports"], clock, recorder)
    pump.run_once()  # fires 01:00
    any_repeat.pause("reports", "r", now_ms=clock())
    clock.set(T0 + 5 * HOUR + 30 * 60_000)  # 02:00 .. 05:00 passed while paused
    assert any_repeat.resume("reports", "r", catchup=catchup, now_ms=clock())
    for _ in range(6):
        pump.run_once()
    clock.set(T0 + 6 * HOUR)
    pump.run_once()
    assert [o.due_ms for o in recorder.occurrences] == [T0 + HOUR, *fired]
    registration = any_repeat.get("reports", "r")
    assert registration is not None and registration.missed == missed


def test_the_cli_pauses_with_a_note_shows_it_and_resumes_in_bulk(run: Run, repeat: Repeat) -> None:
    one = define(every="1h", template=TEMPLATE)
    repeat.upsert_many([("reports", "a", one), ("reports", "b", one)], source="billing")
    result = run("pause", "reports", "a", "--note", "relay down", "--by", "alice")
    assert result.exit_code == 0 and result.output == "paused reports/a\n"
    show = run("show", "reports", "a")
    assert "paused by alice, " in show.output and "note      relay down" in show.output
    data = json.loads(run("show", "reports", "a", "--json").output)
    assert (data["paused_note"], data["paused_by"]) == ("relay down", "alice")
    result = run("pause", "reports", "--source", "billing", "--note", "freeze")
    assert result.exit_code == 0 and result.output == "paused 1 in reports\n  b\n"
    result = run("resume", "reports", "--all", "--catchup")
    assert result.exit_code == 0 and result.output == "resumed 2 in reports\n  a\n  b\n"
    assert not any(r.paused for r in repeat.list("reports"))


@pytest.mark.parametrize(
    "args",
    [
        ("pause", "reports"),
        ("pause", "reports", "a", "--all"),
        ("resume", "reports", "a", "--source", "s"),
    ],
)
def test_the_cli_wants_exactly_one_of_name_all_or_source(run: Run, args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2
    assert "give exactly one of NAME, --all or --source" in result.output


def test_the_cli_refuses_a_bad_note_with_exit_1_and_writes_nothing(
    run: Run, repeat: Repeat
) -> None:
    repeat.register("reports", "a", every="1h", template=TEMPLATE)
    result = run("pause", "reports", "a", "--note", "x" * 501)
    assert result.exit_code == 1 and "limit is 500" in result.output
    registration = repeat.get("reports", "a")
    assert registration is not None and not registration.paused
