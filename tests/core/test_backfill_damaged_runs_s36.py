"""A backfill never re-sends a slot fired live when the record's runs were edited into
garbage (found by a probe of damaged registries, session 36).

With `run` set to `abc` by hand, backfill.lua read it as "no open run", and as the field
existed it did not fall back to created_ms..last_due_ms: every slot fired live was queued
again and sent (same ids, `backfill=True`). The next claim then wrote a fresh `run` and
dropped what the damaged one covered, so the slots stayed open to a backfill for good. Now
a garbage `run` or `runs` counts everything up to the last slot fired as fired live, in
the backfill and in the claim that replaces it. A real server; a pump with a manual clock.
"""

from __future__ import annotations

import pytest
import redis

from emq_bridge import Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher

START = 1_900_000_000_000


def fired_for_eight_seconds(client: redis.Redis, prefix: str) -> tuple[Repeat, ManualClock]:
    """Slots START.. START+7 s: four fired, two dropped (no tick: the run closes into `runs`),
    two fired. A clean backfill queues the two dropped ones."""
    clock = ManualClock(START - 500)
    repeat = Repeat(client, prefix, clock=clock)
    repeat.upsert("qa", "a3", every="1s", template={"task": "t"})
    pump = Pump(repeat, ["qa"], RecordingDispatcher())
    for step in (1_000, 1_000, 1_000, 1_000, 3_000, 1_000):
        clock.advance(step)
        pump.run_once()
    return repeat, clock


@pytest.mark.parametrize(
    ("field", "value"), [("run", "abc"), ("run", "1 2"), ("runs", "x-y"), ("runs", "5-6 junk")]
)
def test_a_backfill_over_garbage_runs_queues_no_slot_fired_live(
    client: redis.Redis, prefix: str, field: str, value: str
) -> None:
    repeat, _ = fired_for_eight_seconds(client, prefix)
    clean = repeat.backfill("qa", "a3", START, START + 7_000, dry_run=True)
    assert clean.queued == [START + 4_000, START + 5_000] and clean.live == 6, clean
    client.hset(repeat.keys("qa").record("a3"), field, value)
    # What fired is unknown now: nothing up to the last slot fired is sent (the two dropped
    # ones included: never twice rather than once).
    damaged = repeat.backfill("qa", "a3", START, START + 7_000, dry_run=True)
    assert damaged.queued == [], damaged


def test_the_claim_after_a_garbage_run_keeps_what_it_covered(
    client: redis.Redis, prefix: str
) -> None:
    repeat, clock = fired_for_eight_seconds(client, prefix)
    client.hset(repeat.keys("qa").record("a3"), "run", "abc")
    pump = Pump(repeat, ["qa"], RecordingDispatcher())
    clock.advance(1_000)
    pump.run_once()  # writes a fresh `run`
    result = repeat.backfill("qa", "a3", START, START + 8_000, dry_run=True)
    assert result.queued == [], result
