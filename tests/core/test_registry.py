"""The registry moves on a real server, and on fakeredis for users' test suites."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from emq_bridge import InvalidName, Repeat, ScheduleError, occurrence_id
from emq_bridge.keys import MAX_NAME_BYTES

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
TEMPLATE = {"task": "reports.digest", "args": [1], "kwargs": {"full": True}}


def keys_under(repeat: Repeat) -> set[str]:
    return {
        k.decode() if isinstance(k, bytes) else k
        for k in repeat.client.scan_iter(match=f"{repeat.prefix}:*")
    }


def command_calls(client: Any, *commands: str) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)


def test_register_twice_answers_registered_then_exists_and_keeps_one_record(
    any_repeat: Repeat,
) -> None:
    assert (
        any_repeat.register("reports", "digest", every_ms=900_000, template=TEMPLATE, now_ms=T0)
        == "registered"
    )
    assert (
        any_repeat.register("reports", "digest", every_ms=60_000, template={}, now_ms=T0 + 5)
        == "exists"
    )
    keys = any_repeat.keys("reports")
    assert any_repeat.client.zrange(keys.registry, 0, -1, withscores=True) == [
        (b"digest", float(T0 + 900_000))
    ]
    record = any_repeat.client.hgetall(keys.record("digest"))
    # EchoMQ's field names, and the first definition kept.
    assert record[b"every_ms"] == b"900000"
    assert json.loads(record[b"template"]) == TEMPLATE


def test_a_hundred_concurrent_registers_give_one_registered_and_one_entry(
    redis_url: str, prefix: str
) -> None:
    results: list[str] = []
    barrier = threading.Barrier(100)

    def boot() -> None:
        repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
        barrier.wait()
        results.append(repeat.register("reports", "digest", every="15m", template=TEMPLATE))

    threads = [threading.Thread(target=boot) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["exists"] * 99 + ["registered"]
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    assert repeat.names("reports") == ["digest"]
    assert keys_under(repeat) == {
        f"{prefix}:{{reports}}:repeat",
        f"{prefix}:{{reports}}:repeat:digest",
    }


def test_cancel_removes_both_keys_and_a_later_register_is_fresh(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0)
    assert any_repeat.cancel("reports", "digest") is True
    assert keys_under(any_repeat) == set()
    assert any_repeat.cancel("reports", "digest") is False
    assert (
        any_repeat.register("reports", "digest", every="1m", template=TEMPLATE, now_ms=T0)
        == "registered"
    )
    registration = any_repeat.get("reports", "digest")
    assert registration is not None and registration.next_run_ms == T0 + 60_000


def test_upsert_creates_then_leaves_an_unchanged_definition_alone(any_repeat: Repeat) -> None:
    assert (
        any_repeat.upsert("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0)
        == "created"
    )
    keys = any_repeat.keys("reports")
    before = (
        any_repeat.client.zscore(keys.registry, "digest"),
        any_repeat.client.hgetall(keys.record("digest")),
    )
    assert (
        any_repeat.upsert("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0 + 600_000)
        == "unchanged"
    )
    after = (
        any_repeat.client.zscore(keys.registry, "digest"),
        any_repeat.client.hgetall(keys.record("digest")),
    )
    assert after == before


def test_an_unchanged_upsert_issues_no_write_command(repeat: Repeat) -> None:
    repeat.upsert("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0)
    writes = ("hset", "zadd", "hdel", "del", "zrem", "hincrby")
    before = command_calls(repeat.client, *writes)
    for _ in range(5):
        assert repeat.upsert("reports", "digest", every="15m", template=TEMPLATE) == "unchanged"
    assert command_calls(repeat.client, *writes) == before


def test_a_changed_cadence_rederives_the_score_and_a_changed_template_keeps_it(
    any_repeat: Repeat,
) -> None:
    any_repeat.upsert("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0)
    assert (
        any_repeat.upsert(
            "reports", "digest", every="15m", template={"task": "other"}, now_ms=T0 + 1000
        )
        == "updated"
    )
    registration = any_repeat.get("reports", "digest")
    assert registration is not None
    assert registration.next_run_ms == T0 + 900_000
    assert registration.definition.template == {"task": "other"}
    assert (
        any_repeat.upsert(
            "reports",
            "digest",
            cron="0 9 * * *",
            tz="Europe/Paris",
            template={"task": "other"},
            now_ms=T0 + 2000,
        )
        == "updated"
    )
    registration = any_repeat.get("reports", "digest")
    assert registration is not None
    assert registration.next_run_ms == registration.definition.cadence.next_after(T0 + 2000)
    # The interval's field is gone from the record: the cron definition replaced it whole.
    assert any_repeat.client.hget(any_repeat.keys("reports").record("digest"), "every_ms") is None


def test_a_change_of_owner_is_an_update_that_keeps_the_cadence(any_repeat: Repeat) -> None:
    any_repeat.upsert("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0)
    assert (
        any_repeat.upsert(
            "reports", "digest", every="15m", template=TEMPLATE, source="app", now_ms=T0 + 9
        )
        == "updated"
    )
    registration = any_repeat.get("reports", "digest")
    assert (
        registration is not None
        and registration.source == "app"
        and registration.next_run_ms == T0 + 900_000
    )
    assert any_repeat.cancel("reports", "digest", if_source="someone-else") is False
    assert any_repeat.cancel("reports", "digest", if_source="app") is True


def test_pause_parks_the_entry_and_resume_keeps_an_interval_on_its_grid(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="10s", template=TEMPLATE, now_ms=T0)
    assert any_repeat.pause("reports", "digest") is True
    assert any_repeat.pause("reports", "digest") is False
    paused = any_repeat.get("reports", "digest")
    assert paused is not None and paused.paused and paused.next_run_ms == T0 + 10_000
    assert any_repeat.names("reports") == ["digest"]  # still one member, at +inf
    assert any_repeat.scan("reports", 10, T0 + 10**9).due == []
    assert any_repeat.resume("reports", "digest", now_ms=T0 + 35_000) is True
    resumed = any_repeat.get("reports", "digest")
    assert resumed is not None and not resumed.paused and resumed.next_run_ms == T0 + 40_000
    assert any_repeat.resume("reports", "digest") is False
    with pytest.raises(KeyError):
        any_repeat.pause("reports", "missing")


def test_trigger_adds_an_immediate_occurrence_without_moving_the_cadence(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    occurrence_id = any_repeat.trigger("reports", "digest", now_ms=T0 + 5)
    assert any_repeat.scan("reports", 10, T0 + 5).expired == ["digest 1899936000005 manual"]
    assert any_repeat.get("reports", "digest").next_run_ms == T0 + 3_600_000  # type: ignore[union-attr]
    assert len(occurrence_id) == 36
    with pytest.raises(KeyError):
        any_repeat.trigger("reports", "missing")


def test_list_and_queues_and_next_runs_read_back_what_was_written(any_repeat: Repeat) -> None:
    any_repeat.register("a", "x", every="1m", template=TEMPLATE, now_ms=T0)
    any_repeat.register("a", "y", cron="0 9 * * *", tz="Europe/Paris", template=TEMPLATE, now_ms=T0)
    any_repeat.register("b", "z", every="1s", template=TEMPLATE, now_ms=T0)
    assert [r.name for r in any_repeat.list("a")] == ["x", "y"]
    assert any_repeat.queues() == ["a", "b"]
    assert any_repeat.next_runs("a", "x", 3) == [T0 + 60_000, T0 + 120_000, T0 + 180_000]


def test_all_keys_of_a_queue_share_one_cluster_slot(repeat: Repeat) -> None:
    keys = repeat.keys("reports")
    slots = {
        key_slot(k.encode())
        for k in [keys.registry, keys.leases, keys.record("digest"), keys.record("a:b")]
    }
    assert len(slots) == 1


BAD_NAMES = [
    "",
    "{x}",
    "a b",
    "a\nb",
    "a\x00b",
    "tab\t",
    "x" * (MAX_NAME_BYTES + 1),
    "é" * 101,
    "\u2028",
]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_bad_queue_or_registration_name_is_refused_before_anything_is_written(
    any_repeat: Repeat, bad: str
) -> None:
    with pytest.raises(InvalidName):
        any_repeat.register(bad, "digest", every="1m", template=TEMPLATE)
    with pytest.raises(InvalidName):
        any_repeat.upsert("reports", bad, every="1m", template=TEMPLATE)
    assert keys_under(any_repeat) == set()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"every_ms": 0},
        {"every_ms": -1},
        {"every": "soon"},
        {"cron": "61 * * * *"},
        {"cron": "0 9 * * *", "tz": "Nowhere/Land"},
        {"every": "1m", "cron": "* * * * *"},
        {},
        {"every": "1m", "template": {"when": object()}},
        {"every": "1m", "template": {"nan": float("nan")}},
        {"every": "1m", "template": ["not", "an", "object"]},
        {"every": "1m", "template": {"big": "x" * 70_000}},
        {"every": "1m", "misfire": "sometimes"},
        {"every": "1m", "anchor": "whenever"},
        {"every": "1m", "tz": "Europe/Paris"},
    ],
)
def test_bad_definitions_raise_a_schedule_error_and_write_nothing(
    any_repeat: Repeat, kwargs: dict[str, Any]
) -> None:
    kwargs.setdefault("template", TEMPLATE)
    with pytest.raises(ScheduleError):
        any_repeat.register("reports", "digest", **kwargs)
    with pytest.raises(ScheduleError):
        any_repeat.upsert("reports", "digest", **kwargs)
    assert keys_under(any_repeat) == set()


def test_an_unreachable_server_is_a_registry_unavailable_error() -> None:
    from emq_bridge import RegistryUnavailable

    repeat = Repeat(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2))
    with pytest.raises(RegistryUnavailable):
        repeat.register("reports", "digest", every="1m", template=TEMPLATE, now_ms=T0)


def test_an_unchanged_sync_reads_digests_and_writes_nothing(repeat: Repeat) -> None:
    from emq_bridge import Declaration, define, sync

    declarations = [
        Declaration("reports", f"job-{i}", define(every=f"{i + 1}m", template=TEMPLATE))
        for i in range(50)
    ]
    assert len(sync(repeat, declarations, "app").create) == 50

    def writes() -> int:
        return int(repeat.client.info("persistence")["rdb_changes_since_last_save"])

    repeat.digests("reports")  # the server has seen the `fetch` script (no NOSCRIPT below)
    writes_before = writes()
    scripts_before = command_calls(repeat.client, "evalsha", "eval")
    again = sync(repeat, declarations, "app")
    assert (len(again.unchanged), again.changes) == (50, 0)
    assert writes() == writes_before
    # The digests are read in one `fetch` call (read-only); no upsert is sent.
    assert command_calls(repeat.client, "evalsha", "eval") == scripts_before + 1
    assert repeat.digests("reports")["job-0"][1] == "app"


def test_a_paused_schedule_whose_declaration_moves_to_another_queue_stays_paused(
    repeat: Repeat,
) -> None:
    # A task route changed (Celery `task_routes`, a default queue): the declaration is the
    # same schedule on another queue. Its pause, note and counters go with it; it does not
    # start firing again. One not paused moves as a new registration.
    from emq_bridge import Declaration, define, sync

    def declared(queue: str) -> list[Declaration]:
        return [
            Declaration(queue, "moved", define(every="10s", template=TEMPLATE)),
            Declaration(queue, "free", define(every="10s", template=TEMPLATE)),
        ]

    sync(repeat, declared("q1"), "app")
    outcome = {
        "missed": 3,
        "failures": 2,
        "last_status": "failed",
        "last_error": "ValueError: bad",
        "last_finished_ms": 1_800_000_000_000,
    }
    repeat.client.hset(repeat.keys("q1").record("moved"), mapping={"fired": 7, **outcome})
    assert repeat.pause("q1", "moved", note="until the fix ships", by="ops")
    before = repeat.get("q1", "moved")
    assert before is not None and before.paused
    plan = sync(repeat, declared("routed"), "app")
    assert sorted(plan.remove) == [("q1", "free"), ("q1", "moved")]
    assert repeat.get("q1", "moved") is None
    after = repeat.get("routed", "moved")
    assert after is not None and after.paused
    assert (after.paused_note, after.paused_by, after.paused_ms) == (
        "until the fix ships",
        "ops",
        before.paused_ms,
    )
    assert after.fired == 7 and after.next_run_ms == before.next_run_ms  # same cadence
    assert (after.missed, after.failures, after.last_status, after.last_error) == (
        3,
        2,
        "failed",
        "ValueError: bad",
    )
    assert after.last_finished_ms == 1_800_000_000_000
    assert repeat.resume("routed", "moved")
    resumed = repeat.get("routed", "moved")
    assert resumed is not None and not resumed.paused and resumed.next_run_ms is not None
    assert resumed.failures == 0  # resuming clears the streak, as in its old queue
    free = repeat.get("routed", "free")
    assert free is not None and not free.paused and free.fired == 0


def test_apply_plan_applies_what_plan_sync_read_and_converges_with_a_sync_between(
    any_repeat: Repeat,
) -> None:
    from emq_bridge import Declaration, apply_plan, define, plan_sync, sync

    def declared(every: str, names: list[str]) -> list[Declaration]:
        return [Declaration("reports", n, define(every=every, template=TEMPLATE)) for n in names]

    sync(any_repeat, declared("5m", ["kept", "changed", "dropped"]), "app")
    wanted = declared("5m", ["kept"]) + declared("10m", ["changed", "new", "raced"])
    plan = plan_sync(any_repeat, wanted, "app")
    assert [d.name for d in plan.create] == ["new", "raced"]
    assert ([d.name for d in plan.update], plan.remove) == (["changed"], [("reports", "dropped")])
    sync(any_repeat, declared("10m", ["raced"]), "other", prune=False)  # after the plan was read

    applied = apply_plan(any_repeat, plan)
    assert [d.name for d in applied.create] == ["new"]
    assert sorted(d.name for d in applied.update) == ["changed", "raced"]  # now "app"'s
    assert applied.remove == [("reports", "dropped")]
    assert sorted(any_repeat.names("reports")) == ["changed", "kept", "new", "raced"]
    assert plan_sync(any_repeat, wanted, "app").changes == 0
    with pytest.raises(ValueError, match="generation"):
        apply_plan(any_repeat, plan_sync(any_repeat, wanted, "app", generation=3))


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.text(min_size=1, max_size=12), min_size=3, max_size=3),
    due_ms=st.integers(min_value=0, max_value=2**53),
    triggered=st.booleans(),
)
def test_an_occurrence_id_is_the_uuid5_of_its_escaped_identity(
    parts: list[str], due_ms: int, triggered: bool
) -> None:
    # The contract's definition, spelled out with the standard library; the pump computes
    # it a faster way, which must give the same text.
    from emq_bridge.occurrence import _OCCURRENCE_NAMESPACE

    escaped = [p.replace("\\", "\\\\").replace(":", "\\:") for p in parts]
    seed = ":".join([*escaped, str(due_ms)]) + (":manual" if triggered else "")
    expected = str(uuid.uuid5(_OCCURRENCE_NAMESPACE, seed))
    assert occurrence_id(*parts, due_ms, triggered=triggered) == expected
    other = [parts[0], parts[1] + ":" + parts[2][:1], parts[2][1:] or "x"]
    assert occurrence_id(*other, due_ms, triggered=triggered) != expected


def test_a_failing_chunk_of_a_large_upsert_raises_and_leaves_the_client_usable(
    repeat: Repeat,
) -> None:
    from emq_bridge import Definition, RegistryError, define

    definition: Definition = define(every="1h", template=TEMPLATE)
    repeat.client.set(repeat.keys("broken").registry, "not a sorted set")
    items = [("broken", f"job-{i}", definition) for i in range(1200)]  # three chunks
    with pytest.raises(RegistryError):
        repeat.upsert_many(items, now_ms=T0)
    # The connection that saw the error was dropped, not returned with a reply in flight.
    ok = repeat.upsert_many([("fine", f"job-{i}", definition) for i in range(1200)], now_ms=T0)
    assert ok == ["created"] * 1200
    assert len(repeat.names("fine")) == 1200


def test_a_wake_subscription_hears_a_change_to_its_queue_and_not_to_others(
    redis_url: str, prefix: str
) -> None:
    with Repeat(redis.Redis.from_url(redis_url), prefix) as repeat:
        wakeups = repeat.subscribe(["watched"])
        assert wakeups.wait(0.1) is False  # nothing changed yet
        repeat.register("other", "x", every="1m", template={"task": "t"})
        assert wakeups.wait(0.2) is False
        repeat.register("watched", "x", every="1m", template={"task": "t"})
        assert wakeups.wait(2.0) is True
        wakeups.close()
        wakeups.close()  # closing twice is harmless


def test_closing_the_registry_closes_its_connections_and_a_later_move_reconnects(
    redis_url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    repeat = Repeat(client, prefix)
    repeat.server_time_ms()
    pooled = list(client.connection_pool._available_connections)
    assert pooled and all(c._sock is not None for c in pooled)
    repeat.close()
    assert all(c._sock is None for c in pooled)  # disconnected
    assert repeat.server_time_ms() > 0
    repeat.close()


def test_get_many_reads_the_registrations_that_exist_in_chunks(
    any_repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    import emq_bridge.registry

    monkeypatch.setattr(emq_bridge.registry, "READ_CHUNK", 2)  # five names: three reads
    for name in ("a", "b", "c", "d"):
        any_repeat.register("q", name, every="1h", template={"task": name})
    found = any_repeat.get_many("q", ["d", "gone", "a", "b", "c"])
    assert sorted(found) == ["a", "b", "c", "d"]
    assert found["d"] == any_repeat.get("q", "d")
    assert found["a"].definition.template == {"task": "a"}
    assert any_repeat.get_many("q", []) == {}
    with pytest.raises(InvalidName):
        any_repeat.get_many("q", ["a", "no spaces"])


def test_one_upsert_call_may_name_a_registration_twice_and_the_second_sees_the_first(
    repeat: Repeat,
) -> None:
    # upsert.lua writes the scores of the records it creates in one ZADD: a later item of
    # the same call that names one of them must still find its score.
    from emq_bridge import define

    minute = define(every="1m", template=TEMPLATE)
    two_minutes = define(every="2m", template={"task": "reports.other"})
    results = repeat.upsert_many(
        [("q", "a", minute), ("q", "b", minute), ("q", "a", two_minutes), ("q", "c", minute)],
        now_ms=T0 + 1,
    )
    assert results == ["created", "created", "updated", "created"]
    scores = dict(repeat.client.zrange(repeat.keys("q").registry, 0, -1, withscores=True))
    assert scores == {b"a": T0 + 120_000, b"b": T0 + 60_000, b"c": T0 + 60_000}
    registration = repeat.get("q", "a")
    assert registration is not None and registration.definition == two_minutes.for_name("a")


def test_an_upsert_onto_a_registry_of_another_type_writes_no_record(repeat: Repeat) -> None:
    from emq_bridge import RegistryError, define

    repeat.client.set(repeat.keys("broken").registry, "not a sorted set")
    with pytest.raises(RegistryError):
        items = [("broken", f"job-{i}", define(every="1h", template=TEMPLATE)) for i in range(3)]
        repeat.upsert_many(items)
    assert keys_under(repeat) == {repeat.keys("broken").registry}
