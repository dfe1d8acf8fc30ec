"""Invariants of report.lua, searched by Hypothesis on a real server.

Whatever reports workers send, in whatever order, with whatever duplicates, about
occurrences still in the history (a report of one older than the history's last N is
applied as new: the history is what remembers):
- sending the same sequence again changes nothing (every report is idempotent);
- sending each report twice in a row ends as sending it once;
- the history never holds more than its cap, nor two entries of one occurrence;
- an occurrence's entry ends on its highest-ranked report (latest attempt, then final over
  retrying over lost over running).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from registry_state import drop_prefix

from emq_bridge import Repeat
from emq_bridge.outcome import Report
from emq_bridge.reporting import Reporter

KINDS = ("started", "succeeded", "failed", "retrying", "skipped", "revoked", "heartbeat")
RANK = {"running": 1, "lost": 2, "retrying": 3}
CAP = 3
DUE = 1_900_000_000_000


@pytest.fixture(scope="module")
def model_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    for prefix in _PREFIXES:  # one per example
        drop_prefix(client, prefix)
    _PREFIXES.clear()
    client.close()


_PREFIXES: list[str] = []


reports = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from(KINDS), st.integers(1, 3)), max_size=25
)


def _apply(repeat: Repeat, plan: list[tuple[int, str, int]], *, twice: bool = False) -> None:
    for slot, kind, attempt in plan:
        item = Report(
            kind,  # type: ignore[arg-type]
            "q",
            "job",
            f"00000000-0000-5000-8000-{slot:012d}",
            DUE + slot,
            DUE + 10 * attempt,
            attempt=attempt,
            error=f"{kind} {attempt}",
        )
        for _ in range(2 if twice else 1):
            repeat.report([item], history_size=CAP)


def _state(repeat: Repeat) -> tuple[dict[bytes, bytes], list[bytes], set[bytes]]:
    """The record, the history and what is in flight (not its deadlines: a heartbeat's very
    purpose is to move them on)."""
    keys = repeat.keys("q")
    record = repeat.client.hgetall(keys.record("job"))
    return (
        record,
        repeat.client.lrange(keys.history("job"), 0, -1),
        set(repeat.client.zrange(keys.running, 0, -1)),
    )


def _fresh(client: redis.Redis) -> Repeat:
    repeat = Repeat(client, f"m{uuid.uuid4().hex[:10]}")
    _PREFIXES.append(repeat.prefix)
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=DUE)
    repeat.upsert("q", "other", every="1h", template={"task": "t"}, now_ms=DUE)
    return repeat


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=reports)
def test_reports_are_idempotent_and_the_history_capped(
    model_client: redis.Redis, plan: list[tuple[int, str, int]]
) -> None:
    once = _fresh(model_client)
    _apply(once, plan)
    state = _state(once)
    history = [json.loads(raw) for raw in state[1]]
    ids = [entry[0] for entry in history]
    assert len(history) <= CAP and len(ids) == len(set(ids))
    if len({slot for slot, _, _ in plan}) > CAP:
        return  # older occurrences left the history: the rest holds within it only
    _apply(once, plan)  # the same reports again: nothing changes
    assert _state(once) == state

    doubled = _fresh(model_client)
    _apply(doubled, plan, twice=True)
    assert _state(doubled)[1:] == state[1:]
    assert {k: v for k, v in _state(doubled)[0].items() if k != b"created_ms"} == {
        k: v for k, v in state[0].items() if k != b"created_ms"
    }

    for entry in history:
        slot = int(entry[0][-12:])
        seen = [(a, k) for s, k, a in plan if s == slot and k != "heartbeat"]
        status = lambda kind: "running" if kind == "started" else kind  # noqa: E731
        best = max(seen, key=lambda ak: (ak[0], RANK.get(status(ak[1]), 4)))
        assert entry[6] == best[0]
        assert RANK.get(entry[5], 4) == RANK.get(status(best[1]), 4)


def _reports(plan: list[tuple[int, str, int]]) -> list[Report]:
    return [
        Report(
            kind,  # type: ignore[arg-type]
            "q",
            "other" if slot == 1 else "job",  # two registrations, whose reports interleave
            f"00000000-0000-5000-8000-{slot:012d}",
            DUE + slot,
            DUE + 10 * attempt + index,
            attempt=attempt,
            error=f"{kind} {attempt}",
        )
        for index, (slot, kind, attempt) in enumerate(plan)
    ]


# Fewer occurrences and attempts, so starts and their ends often meet in one batch.
close_reports = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(KINDS), st.integers(1, 2)), max_size=12
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=close_reports, cut=st.integers(0, 12))
# A worker's skip of a second attempt, its start folded in: counted as when sent one by one.
@example(plan=[(0, "skipped", 1), (0, "started", 2), (0, "skipped", 2)], cut=0)
# A skip, the same attempt run later, skipped again, its start folded in: a rerun (session 40).
@example(plan=[(0, "skipped", 1), (0, "started", 1), (0, "skipped", 1)], cut=0)
def test_a_folded_batch_ends_as_its_reports_one_by_one(
    model_client: redis.Redis, plan: list[tuple[int, str, int]], cut: int
) -> None:
    """The Reporter folds a start into its final report when no report of its registration
    came between them and it was not sent yet: the registry must end exactly as if each
    report had been sent alone, in order, whatever was sent before (a flush at `cut`)."""
    one_by_one = _fresh(model_client)
    for item in _reports(plan):
        one_by_one.report([item], history_size=CAP + 3)
    folded = _fresh(model_client)
    items = _reports(plan)
    reporter = Reporter(folded, history_size=CAP + 3, linger_s=5.0)  # sent only by flushes
    for batch in (items[:cut], items[cut:]):
        for item in batch:
            reporter.report(item)
        assert reporter.flush(10)
    reporter.close()

    def everything(repeat: Repeat) -> list[object]:
        keys = repeat.keys("q")
        state: list[object] = [set(repeat.client.zrange(keys.running, 0, -1))]
        for name in ("job", "other"):
            record = repeat.client.hgetall(keys.record(name))
            state.append({k: v for k, v in record.items() if k != b"created_ms"})
            state.append(repeat.client.lrange(keys.history(name), 0, -1))
        return state

    assert everything(folded) == everything(one_by_one)
