"""What makes a sync of many schedules cheap keeps its results: the digests read in
overlapped chunks, the upsert's shared lists of fields to delete and its create path, the
cron checks and next runs computed once per expression."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from emq_bridge import Cron, Declaration, Repeat, ScheduleError, define, sync
from emq_bridge.registry import record_digest

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
TEMPLATE = {"task": "reports.digest", "args": [1], "kwargs": {}}


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def writes(repeat: Repeat) -> int:
    return int(repeat.client.info("persistence")["rdb_changes_since_last_save"])


def command_calls(client: Any, *commands: str) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)


def test_digests_in_several_chunks_are_every_records_and_a_broken_record_has_none(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("emq_bridge.registry.FETCH_CHUNK", 7)  # 30 records: 5 chunks
    declarations = [
        Declaration("reports", f"job-{i}", define(every=f"{i + 1}m", template=TEMPLATE))
        for i in range(30)
    ]
    sync(repeat, declarations, "app")
    keys = repeat.keys("reports")
    repeat.client.delete(keys.record("job-3"))  # a member without its record
    repeat.client.delete(keys.record("job-4"))
    repeat.client.set(keys.record("job-4"), "not a hash")  # a record edited by hand

    found = repeat.digests("reports")

    assert set(found) == {d.name for d in declarations}
    assert found["job-3"] == found["job-4"] == (None, None)
    assert found["job-5"] == (record_digest(declarations[5].definition, "app"), "app")


def test_an_unchanged_sync_in_several_chunks_writes_nothing_and_sends_no_upsert(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("emq_bridge.registry.FETCH_CHUNK", 7)
    monkeypatch.setattr("emq_bridge.registry.UPSERT_CHUNK", 4)
    declarations = [
        Declaration("reports", f"job-{i}", define(every=f"{i + 1}m", template=TEMPLATE))
        for i in range(30)
    ]
    assert len(sync(repeat, declarations, "app").create) == 30
    before = writes(repeat)
    scripts = command_calls(repeat.client, "evalsha", "eval")

    again = sync(repeat, declarations, "app")

    assert (len(again.unchanged), again.changes) == (30, 0)
    assert writes(repeat) == before
    assert command_calls(repeat.client, "evalsha", "eval") == scripts + 5  # the 5 fetches


def test_one_upsert_call_deletes_each_items_own_dropped_fields(any_repeat: Repeat) -> None:
    first = define(every="1m", template=TEMPLATE, labels={"team": "a"}, overlap="skip")
    second = define(every="2m", template=TEMPLATE, pause_after_failures=3)
    third = define(every="3m", template=TEMPLATE, limit=5)
    items = [("reports", "a", first), ("reports", "b", second), ("reports", "c", third)]
    any_repeat.upsert_many(items, source="app", now_ms=T0)

    plain = [define(every=f"{i}m", template=TEMPLATE) for i in (1, 2, 3)]
    results = any_repeat.upsert_many(
        [("reports", n, d) for n, d in zip("abc", plain, strict=True)],
        source="app",
        now_ms=T0 + 1,
    )

    assert results == ["updated"] * 3
    records = any_repeat.load_records(
        "reports", ["a", "b", "c"], ("labels", "overlap", "pause_after_failures", "limit")
    )
    assert records == {"a": {}, "b": {}, "c": {}}
    assert any_repeat.digests("reports") == {
        n: (record_digest(d, "app"), "app") for n, d in zip("abc", plain, strict=True)
    }


def test_created_records_with_and_without_bounds_get_their_scores(any_repeat: Repeat) -> None:
    limited = define(every="1m", template=TEMPLATE, limit=2)
    ended = define(every="1m", template=TEMPLATE, end_at=_utc(T0 - 60_000))
    plain = define(every="1m", template=TEMPLATE)
    items = [("reports", "limited", limited), ("reports", "ended", ended)]
    any_repeat.upsert_many([*items, ("reports", "plain", plain)], now_ms=T0 + 1)

    records = any_repeat.load_records(
        "reports", ["limited", "ended", "plain"], ("remaining", "completed")
    )
    assert records == {"limited": {"remaining": "2"}, "ended": {"completed": "end_at"}, "plain": {}}
    assert any_repeat.get("reports", "plain").next_run_ms == T0 + 60_000  # type: ignore[union-attr]
    assert any_repeat.get("reports", "ended").next_run_ms is None  # type: ignore[union-attr]


def test_a_bad_cron_fails_the_same_way_every_time_it_is_given() -> None:
    for _ in range(3):
        with pytest.raises(ScheduleError, match="never fires: no month 2 has a day 31"):
            Cron("0 0 31 2 *")
        with pytest.raises(ScheduleError, match="Bad day-of-month"):
            Cron("0 0 32 * *")
        with pytest.raises(ScheduleError, match="must have 5 fields"):
            Cron("0 4 * *")
        with pytest.raises(ScheduleError, match="unknown time zone"):
            Cron("0 4 * * *", "Nowhere/City")


def test_crons_of_one_expression_share_their_runs_and_keep_their_own_seeds() -> None:
    paris = [Cron("30 2 * * *", "Europe/Paris") for _ in range(3)]
    assert {c.resolved for c in paris} == {"30 2 * * *"}
    # Spring forward in Paris: 02:30 does not exist on 2030-03-31, fires at 03:00 CEST.
    march_30 = 1_901_140_200_000  # 2030-03-30T22:30:00Z
    assert {c.next_after(march_30) for c in paris} == {1_901_149_200_000}
    hashed = {Cron("H * * * *", seed=f"job-{i}").resolved for i in range(20)}
    assert len(hashed) > 1  # each seed its own minute
    assert Cron("H * * * *", seed="job-1").resolved == Cron("H * * * *", seed="job-1").resolved
