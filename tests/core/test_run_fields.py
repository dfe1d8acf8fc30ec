"""The runs of fired slots claim.lua keeps for backfill: the open run in one record field
(`run`, "<from> <to> <next>"), closed runs in `runs`; and a definition decoded from its
record has the digests of the one declared."""

from __future__ import annotations

from datetime import datetime, timezone

from emq_bridge import Pump, Repeat
from emq_bridge.definition import Definition, define
from emq_bridge.testing import RecordingDispatcher

H = 3_600_000
T0 = int(datetime(2026, 6, 1, tzinfo=timezone.utc).timestamp() * 1000)


def _record(repeat: Repeat, name: str) -> dict[str, str]:
    raw = repeat.client.hgetall(repeat.keys("q").record(name))
    return {k.decode(): v.decode() for k, v in raw.items()}


def test_the_open_run_is_one_field_and_a_gap_closes_it_into_runs(repeat: Repeat) -> None:
    repeat.upsert("q", "h", definition=define(every="1h", template={"task": "t"}), now_ms=T0)
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    for slot in (T0 + H, T0 + 2 * H):
        assert len(pump.run_once(now_ms=slot + 1).dispatched) == 1
    record = _record(repeat, "h")
    assert record["run"] == f"{T0 + H} {T0 + 2 * H} {T0 + 3 * H}"
    assert not {"run_from", "run_to", "run_next", "runs"} & record.keys()
    # An outage: the policy (latest) drops 3 slots, fires the newest as a run of its own.
    assert len(pump.run_once(now_ms=T0 + 6 * H + 1).dispatched) == 1
    record = _record(repeat, "h")
    assert record["run"] == ""
    assert record["runs"] == f"{T0 + H}-{T0 + 2 * H} {T0 + 6 * H}-{T0 + 6 * H}"
    # The next slot on time opens a new run; backfill skips every slot a run covers.
    assert len(pump.run_once(now_ms=T0 + 7 * H + 1).dispatched) == 1
    assert _record(repeat, "h")["run"] == f"{T0 + 7 * H} {T0 + 7 * H} {T0 + 8 * H}"
    done = repeat.backfill("q", "h", T0 + H, T0 + 7 * H, dry_run=True, now_ms=T0 + 7 * H + 2)
    assert done.queued == [T0 + 3 * H, T0 + 4 * H, T0 + 5 * H]
    assert (done.live, done.ahead) == (4, 0)  # 1h, 2h, 6h, 7h: fired live


def test_a_decoded_definition_has_the_digests_of_its_declaration() -> None:
    declared = define(
        every="1h",
        template={"task": "t", "args": [1]},
        end_at="2030-01-01T00:00:00+00:00",
        limit=3,
        jitter="10s",
        catchup_window="5m",
    )
    decoded = Definition.from_fields(declared.to_fields())
    assert decoded == declared
    assert (decoded.digest, decoded.cadence_digest) == (declared.digest, declared.cadence_digest)
