"""A backfill replays the past out of band (docs/cron.md "Backfill", docs/lifecycle.md): its
runs are in the registration's history, marked `backfill`, but never hold the live schedule
(not its `inflight`/`inflight_also`: live slots are not skipped, buffered or made to replace
behind them) and their outcomes move none of its `last_*` fields, failure streak or pause.
A slot the overlap policy skipped is the live schedule's: a backfill leaves it (`live`).
On a real server (report.lua, claim.lua, backfill.lua)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from emq_bridge import Pump, Repeat
from emq_bridge.cli import cli
from emq_bridge.definition import define
from emq_bridge.lifecycle import report_of
from emq_bridge.occurrence import Occurrence
from emq_bridge.testing import RecordingDispatcher

S = 1000
TEMPLATE = {"task": "t"}


def _record(repeat: Repeat, name: str) -> dict[str, str]:
    raw = repeat.client.hgetall(repeat.keys("q").record(name))
    return {k.decode(): v.decode() for k, v in raw.items()}


def _skipped(repeat: Repeat, name: str) -> int:
    registration = repeat.get("q", name)
    assert registration is not None
    return registration.skipped


def _fire(pump: Pump, recorder: RecordingDispatcher, at: int) -> tuple[list[Occurrence], ...]:
    pump.run_once(at)
    sent = recorder.clear()
    return [o for o in sent if not o.backfill], [o for o in sent if o.backfill]


def test_backfilled_runs_neither_hold_the_live_schedule_nor_move_its_outcomes(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    t0 = repeat.server_time_ms() // (10 * S) * (10 * S)
    definition = define(every="10s", template=TEMPLATE, overlap="skip", pause_after_failures=2)
    repeat.upsert("q", "s", definition=definition, now_ms=t0)
    done = repeat.backfill("q", "s", t0 - 60 * S, t0 - 1, rate=0, now_ms=t0)
    assert len(done.queued) == 6
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    live, backfilled = _fire(pump, recorder, t0 + 10 * S)
    assert len(live) == 1 and len(backfilled) == 6
    first = live[0]
    repeat.started(first)
    for occurrence in backfilled:  # all six run beside the live one
        assert repeat.started(occurrence)
    record = _record(repeat, "s")
    assert record["inflight"] == first.lease_member
    assert "inflight_also" not in record  # not held by the backfilled runs
    assert record["last_started_ms"] and record["last_status"] == "running"
    live_start = record["last_started_ms"]

    # Backfilled failures: no streak, no pause, no last error; the live run's last_* stay.
    for occurrence in backfilled[:3]:
        assert repeat.finished(occurrence, ok=False, error="ValueError: past")
    record = _record(repeat, "s")
    assert "failures" not in record and record.get("paused") != "1"
    assert "last_error" not in record and "last_failure_ms" not in record
    assert record["last_status"] == "running" and record["last_started_ms"] == live_start
    assert record["last_due"] == str(first.due_ms)

    repeat.finished(first, ok=True)
    success = _record(repeat, "s")
    assert success["last_success_due_ms"] == str(first.due_ms)
    # A backfilled success after it does not move the live run's last success.
    assert repeat.finished(backfilled[3], ok=True)
    record = _record(repeat, "s")
    assert record["last_success_ms"] == success["last_success_ms"]
    assert record["last_success_due_ms"] == str(first.due_ms)
    assert record["last_status"] == "succeeded" and record["last_due"] == str(first.due_ms)

    # Two backfilled runs still run: the next live slot is sent, not skipped.
    second, more = _fire(pump, recorder, t0 + 20 * S)
    assert len(second) == 1 and more == []
    assert _record(repeat, "s")["inflight"] == second[0].lease_member
    assert _skipped(repeat, "s") == 0
    # The backfilled ones end: the live one stays in flight (the next slot is skipped).
    for occurrence in backfilled[4:]:
        assert repeat.finished(occurrence, ok=False, error="ValueError: past")
    record = _record(repeat, "s")
    assert record["inflight"] == second[0].lease_member and record.get("paused") != "1"
    assert _fire(pump, recorder, t0 + 30 * S) == ([], [])
    assert _skipped(repeat, "s") == 1

    # The history has them all, the backfilled ones marked.
    history = {entry.due_ms: entry for entry in repeat.history("q", "s")}
    for occurrence in backfilled:
        assert history[occurrence.due_ms].backfill
        assert history[occurrence.due_ms].to_dict()["backfill"] is True
    assert history[backfilled[0].due_ms].status == "failed"
    assert history[backfilled[3].due_ms].status == "succeeded"
    assert not history[first.due_ms].backfill and history[first.due_ms].status == "succeeded"
    runner = CliRunner()
    base = ["--redis-url", redis_url, "--prefix", prefix, "history", "q", "s"]
    shown = runner.invoke(cli, [*base, "-n", "20"])
    assert shown.exit_code == 0, shown.output
    assert sum("backfill" in line for line in shown.output.splitlines()) == 6
    as_json = json.loads(runner.invoke(cli, [*base, "-n", "20", "--json"]).output)
    assert sorted(e["due_ms"] for e in as_json if e["backfill"]) == sorted(
        o.due_ms for o in backfilled
    )


def test_a_report_says_backfill_from_the_message_and_an_older_workers_is_a_live_one(
    repeat: Repeat,
) -> None:
    t0 = repeat.server_time_ms() // (10 * S) * (10 * S)
    repeat.upsert("q", "m", definition=define(every="10s", template=TEMPLATE), now_ms=t0)
    repeat.backfill("q", "m", t0 - 20 * S, t0 - 1, rate=0, now_ms=t0)
    recorder = RecordingDispatcher()
    _, (a, b) = _fire(Pump(repeat, ["q"], recorder), recorder, t0 + 1)
    # (the list target's message carries `backfill`)
    message = {"id": a.id, "queue": "q", "name": "m", "due_ms": a.due_ms, "backfill": True}
    item = report_of("failed", message, error="E: x")
    assert item.backfill and item.to_json_item()[-2:] == [1, 1]
    assert item.ended("succeeded", item.at_ms).backfill
    repeat.report([item])
    # An older worker's report (no flag) of another backfilled occurrence: a live one.
    old = report_of("failed", {"id": b.id, "queue": "q", "name": "m", "due_ms": b.due_ms})
    assert len(old.to_json_item()) == 12
    repeat.report([old])
    record = _record(repeat, "m")
    assert record["failures"] == "1" and record["last_due"] == str(b.due_ms)
    entries = {entry.due_ms: entry for entry in repeat.history("q", "m")}
    assert entries[a.due_ms].backfill and not entries[b.due_ms].backfill


def test_a_slot_the_overlap_policy_skipped_is_the_live_schedules_and_never_backfilled(
    repeat: Repeat,
) -> None:
    t0 = repeat.server_time_ms() // (10 * S) * (10 * S)
    repeat.upsert(
        "q", "k", definition=define(every="10s", template=TEMPLATE, overlap="skip"), now_ms=t0
    )
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    (first,), _ = _fire(pump, recorder, t0 + 10 * S)
    repeat.started(first)
    assert _fire(pump, recorder, t0 + 20 * S) == ([], [])  # skipped: the first runs
    repeat.finished(first, ok=True)
    (third,), _ = _fire(pump, recorder, t0 + 30 * S)
    repeat.finished(third, ok=True)
    skipped = [e for e in repeat.history("q", "k") if e.status == "skipped"]
    assert [e.due_ms for e in skipped] == [t0 + 20 * S]
    done = repeat.backfill("q", "k", t0 + 10 * S, t0 + 30 * S, rate=0, now_ms=t0 + 31 * S)
    assert done.queued == [] and done.live == 3
    assert _fire(pump, recorder, t0 + 32 * S) == ([], [])
    assert [e.status for e in repeat.history("q", "k")] == ["succeeded", "skipped", "succeeded"]
