"""Killed pumps: SIGKILL pump processes at random while 2,000 registrations fire every second.

Four pump processes share one queue. A chaos loop SIGKILLs a random one every few hundred
ms and forks a replacement. Each pump records what it dispatches (with its pid) on a list
of the same server. Afterwards every nominal slot of the window must have been dispatched,
and a slot dispatched twice must carry one occurrence id, be marked as a re-dispatch, and
have been dispatched first by a pump that was killed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import redis

from emq_bridge import Occurrence, Pump, Repeat, define, occurrence_id
from emq_bridge.embedded import EmbeddedServer

from .conftest import die_with_parent

pytestmark = pytest.mark.faults

QUEUE = "chaos"
REGISTRATIONS = 2_000
EVERY_MS = 1_000
PHASES = 10  # registrations are spread over 10 phases of the second, 200 per phase
PUMPS = 4
CHAOS_S = 21.0
LEASE_MS = 2_000
OUT_KEY = "fired"


class RecordingPush:
    """Push each occurrence, with the pid of the pump that sent it, onto a list (RPUSH)."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key
        self.pid = os.getpid()

    def dispatch(self, occurrence: Occurrence) -> None:
        self.client.rpush(
            self.key,
            json.dumps(
                {
                    "name": occurrence.name,
                    "due_ms": occurrence.due_ms,
                    "id": occurrence.id,
                    "pid": self.pid,
                    "redelivered": occurrence.redelivered,
                    "released_ms": occurrence.released_ms,
                }
            ),
        )


def run_pump(url: str, prefix: str) -> None:
    """The body of one pump process (forked): pump until killed."""
    die_with_parent()
    client = redis.Redis.from_url(url)
    pump = Pump(
        Repeat(client, prefix),
        [QUEUE],
        RecordingPush(client, f"{prefix}:{OUT_KEY}"),
        lease_ms=LEASE_MS,
        batch_size=250,
        max_sleep_s=0.5,
    )
    pump.run()


class Chaos:
    """Pump processes, and the record of which ones were killed."""

    def __init__(self, url: str, prefix: str) -> None:
        self.context = multiprocessing.get_context("fork")
        self.url, self.prefix = url, prefix
        self.live: list[Any] = []
        self.killed: set[int] = set()

    def start(self) -> None:
        process = self.context.Process(target=run_pump, args=(self.url, self.prefix), daemon=True)
        process.start()
        self.live.append(process)

    def kill_one(self, rng: random.Random) -> None:
        victim = self.live.pop(rng.randrange(len(self.live)))
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        self.killed.add(victim.pid)

    def stop_all(self) -> None:
        for process in self.live:
            process.terminate()
        for process in self.live:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        self.live = []


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_until_window_is_served(repeat: Repeat, client: redis.Redis, window_end_ms: int) -> None:
    """Poll until every slot due by `window_end_ms` was claimed and its lease acked."""
    keys = repeat.keys(QUEUE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        behind = client.zcount(keys.registry, "-inf", window_end_ms)
        in_flight = [m for m in repeat.leases(QUEUE) if m[1] <= window_end_ms]
        if behind == 0 and not in_flight:
            return
        time.sleep(0.2)
    raise AssertionError(
        f"the window was not served in 30 s: {behind} behind, {len(in_flight)} in flight"
    )


def test_every_slot_fires_despite_pumps_being_killed_and_duplicates_only_follow_a_kill(
    report: Callable[[str], None],
) -> None:
    rng = random.Random(7)
    prefix = "killed"
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        repeat = Repeat(client, prefix)
        # Anchored on the registration instant, so the phases below spread the slots over
        # the second (on the default grid they would all share one instant).
        definition = define(
            every_ms=EVERY_MS, anchor="schedule", misfire="catchup", template={"task": "tick"}
        )
        start_ms = server_ms(client) + 500
        first_runs: dict[str, int] = {}
        per_phase = REGISTRATIONS // PHASES
        for phase in range(PHASES):
            names = [f"r{phase * per_phase + i}" for i in range(per_phase)]
            registered_at = start_ms + phase * (EVERY_MS // PHASES)
            results = repeat.upsert_many(
                [(QUEUE, n, definition) for n in names], now_ms=registered_at
            )
            assert set(results) == {"created"}
            first_runs.update((n, registered_at + EVERY_MS) for n in names)

        chaos = Chaos(server.url, prefix)
        kills = 0
        try:
            for _ in range(PUMPS):
                chaos.start()
            chaos_end = time.monotonic() + CHAOS_S
            while time.monotonic() < chaos_end:
                time.sleep(rng.uniform(0.2, 0.6))
                chaos.kill_one(rng)
                kills += 1
                chaos.start()
            window_end_ms = server_ms(client)
            wait_until_window_is_served(repeat, client, window_end_ms)
            recovered_ms = server_ms(client) - window_end_ms
        finally:
            chaos.stop_all()

        records = [json.loads(raw) for raw in client.lrange(f"{prefix}:{OUT_KEY}", 0, -1)]
        client.close()

    dispatched: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        dispatched[(record["name"], record["due_ms"])].append(record)
    expected = {
        (name, due)
        for name, first in first_runs.items()
        for due in range(first, window_end_ms + 1, EVERY_MS)
    }
    missing = expected - dispatched.keys()
    duplicates = {slot: found for slot, found in dispatched.items() if len(found) > 1}
    redispatched = [r for r in records if r["redelivered"] and r["due_ms"] <= window_end_ms]
    recovery = max((r["released_ms"] - r["due_ms"] for r in redispatched), default=0)
    report(
        f"\nkilled pumps: {len(expected)} slots in the window, {len(records)} dispatches, "
        f"{kills} kills, {len(redispatched)} re-dispatches after a lease expired, "
        f"{len(duplicates)} slots dispatched twice, slowest re-dispatch {recovery} ms after its "
        f"slot (lease {LEASE_MS} ms), window served {recovered_ms} ms after the last kill"
    )
    assert kills >= 30
    assert redispatched, "no lease expired: the scenario did not exercise re-dispatch"
    assert not missing, f"{len(missing)} slots never dispatched, e.g. {sorted(missing)[:5]}"
    assert all((name, due) in expected or due > window_end_ms for name, due in dispatched), (
        "a dispatch fell off the nominal grid"
    )
    for (name, due), found in duplicates.items():
        assert {r["id"] for r in found} == {occurrence_id(prefix, QUEUE, name, due)}
        first, *again = sorted(found, key=lambda r: r["released_ms"])
        assert all(r["redelivered"] for r in again), f"{name}@{due} was fired twice as fresh"
        assert first["pid"] in chaos.killed, f"{name}@{due} was re-dispatched but its pump lived"
