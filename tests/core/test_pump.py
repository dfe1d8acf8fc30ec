"""The pump: batches, concurrency, crash recovery, wake-ups and misfires, on a real server."""

from __future__ import annotations

import copy as copy_module
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence

import pytest
import redis

from emq_bridge import Occurrence, Pump, Repeat, define, occurrence_id
from emq_bridge.testing import ManualClock, RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000
TEMPLATE = {"task": "reports.digest"}


def test_eight_pumps_dispatch_each_of_a_thousand_due_occurrences_exactly_once(
    redis_url: str, prefix: str
) -> None:
    setup = Repeat(redis.Redis.from_url(redis_url), prefix)
    for i in range(1000):
        setup.register("burst", f"job-{i}", every="1h", template=TEMPLATE, now_ms=T0)
    recorder = RecordingDispatcher()
    barrier = threading.Barrier(8)

    def pump() -> None:
        repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
        barrier.wait()
        Pump(repeat, ["burst"], recorder, batch_size=37).run_once(now_ms=T0 + HOUR)

    threads = [threading.Thread(target=pump) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [o.id for o in recorder.occurrences]
    assert len(ids) == 1000
    assert len(set(ids)) == 1000
    assert sorted(recorder.names()) == sorted(f"job-{i}" for i in range(1000))
    assert setup.leases("burst") == []  # everything acked
    assert {r.next_run_ms for r in setup.list("burst")} == {T0 + 2 * HOUR}


def test_each_occurrence_carries_an_id_derived_from_queue_name_and_due_time(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    recorder = RecordingDispatcher()
    Pump(any_repeat, ["reports"], recorder).run_once(now_ms=T0 + HOUR + 5)
    [occurrence] = recorder.occurrences
    assert occurrence.due_ms == T0 + HOUR
    assert occurrence.id == occurrence_id(any_repeat.prefix, "reports", "digest", T0 + HOUR)
    assert occurrence.template == TEMPLATE and not occurrence.redelivered


def test_a_pump_killed_between_claim_and_ack_is_covered_by_another_with_the_same_id(
    redis_url: str, prefix: str
) -> None:
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    doomed = textwrap.dedent(f"""
        import os, redis
        from emq_bridge import Pump, Repeat
        class Crash:
            def dispatch(self, occurrence):
                print(occurrence.id, flush=True)
                os._exit(9)  # dies after the claim, before the ack
        repeat = Repeat(redis.Redis.from_url({redis_url!r}), {prefix!r})
        Pump(repeat, ["reports"], Crash(), lease_ms=30_000).run_once(now_ms={T0 + HOUR})
    """)
    died = subprocess.run(
        [sys.executable, "-c", doomed], capture_output=True, text=True, timeout=60
    )
    assert died.returncode == 9, died.stderr
    claimed_id = died.stdout.strip()
    assert repeat.get("reports", "digest").next_run_ms == T0 + 2 * HOUR  # type: ignore[union-attr]

    survivor = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], survivor, lease_ms=30_000)
    pump.run_once(now_ms=T0 + HOUR + 29_000)
    assert survivor.occurrences == []  # the lease still holds
    pump.run_once(now_ms=T0 + HOUR + 30_000)
    [occurrence] = survivor.occurrences
    assert occurrence.id == claimed_id
    assert occurrence.redelivered and occurrence.due_ms == T0 + HOUR
    assert repeat.leases("reports") == []


def test_a_failed_dispatch_is_retried_after_the_lease_with_the_same_id(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)

    class Flaky:
        def __init__(self) -> None:
            self.calls: list[Occurrence] = []

        def dispatch(self, occurrence: Occurrence) -> None:
            self.calls.append(occurrence)
            if len(self.calls) == 1:
                raise ConnectionError("broker down")

    flaky = Flaky()
    pump = Pump(any_repeat, ["reports"], flaky, lease_ms=10_000)
    tick = pump.run_once(now_ms=T0 + HOUR)
    assert len(tick.failed) == 1 and tick.dispatched == []
    pump.run_once(now_ms=T0 + HOUR + 10_000)
    assert [c.id for c in flaky.calls] == [flaky.calls[0].id] * 2
    assert any_repeat.leases("reports") == []


def test_the_score_moves_at_claim_so_a_late_release_never_pushes_the_cadence(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("reports", "digest", every="15m", template=TEMPLATE, now_ms=T0)
    tick = Pump(any_repeat, ["reports"], RecordingDispatcher()).run_once(
        now_ms=T0 + 900_000 + 7_000
    )
    assert any_repeat.get("reports", "digest").next_run_ms == T0 + 1_800_000  # type: ignore[union-attr]
    assert tick.next_wake_ms == T0 + 1_800_000


def test_missed_slots_coalesce_by_default_and_are_counted(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    any_repeat.register(
        "reports", "digest", every="10m", anchor="schedule", template=TEMPLATE, now_ms=T0
    )
    recorder = RecordingDispatcher()
    with caplog.at_level(logging.WARNING, logger="emq_bridge.pump"):
        Pump(any_repeat, ["reports"], recorder).run_once(now_ms=T0 + 65 * 60_000)
    # The default (`latest`, `coalesce`'s new meaning): one run, for the newest slot.
    assert [o.due_ms for o in recorder.occurrences] == [T0 + 60 * 60_000]
    assert recorder.occurrences[0].missed == 5
    registration = any_repeat.get("reports", "digest")
    assert (
        registration is not None
        and registration.missed == 5
        and registration.next_run_ms == T0 + 70 * 60_000
    )
    assert "5 slot(s) missed" in caplog.text


def test_the_catchup_policy_fires_every_missed_slot(any_repeat: Repeat) -> None:
    any_repeat.register(
        "reports",
        "digest",
        every="10m",
        anchor="schedule",
        misfire="catchup",
        template=TEMPLATE,
        now_ms=T0,
    )
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder)
    for _ in range(8):
        pump.run_once(now_ms=T0 + 65 * 60_000)
    assert [o.due_ms for o in recorder.occurrences] == [T0 + k * 600_000 for k in range(1, 7)]


def test_a_corrupt_record_is_parked_with_an_error_while_the_others_fire(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("good", "bad", "orphan"):
        any_repeat.register("reports", name, every="1m", template=TEMPLATE, now_ms=T0)
    keys = any_repeat.keys("reports")
    any_repeat.client.hset(keys.record("bad"), "every_ms", "soon")
    any_repeat.client.delete(keys.record("orphan"))
    recorder = RecordingDispatcher()
    with caplog.at_level(logging.ERROR, logger="emq_bridge.pump"):
        tick = Pump(any_repeat, ["reports"], recorder).run_once(now_ms=T0 + 60_000)
    assert recorder.names() == ["good"]
    assert sorted(tick.parked) == ["bad", "orphan"]
    assert "reports/bad: parked for 60s: corrupt record" in caplog.text
    assert any_repeat.client.zscore(keys.registry, "bad") == T0 + 60_000 + 60_000  # parked a minute


def test_a_triggered_occurrence_fires_once_on_the_next_tick(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    triggered = any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder)
    pump.run_once(now_ms=T0 + 20)
    pump.run_once(now_ms=T0 + 30)
    assert [o.id for o in recorder.occurrences] == [triggered]
    [occurrence] = recorder.occurrences
    assert occurrence.triggered and not occurrence.redelivered
    assert any_repeat.leases("reports") == []


def test_a_pump_driven_by_a_manual_clock_fires_exactly_what_the_clock_reaches(
    any_repeat: Repeat,
) -> None:
    clock = ManualClock(T0)
    any_repeat.register("reports", "fast", every="1s", template=TEMPLATE, now_ms=clock())
    any_repeat.register("reports", "slow", every="1m", template=TEMPLATE, now_ms=clock())
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder, clock=clock)
    for _ in range(60):
        clock.advance(1000)
        pump.run_once()
    assert recorder.names().count("fast") == 60
    assert recorder.names().count("slow") == 1


def test_a_sleeping_pump_wakes_for_a_schedule_registered_while_it_sleeps(
    redis_url: str, prefix: str
) -> None:
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register("wake", "placeholder", every="1d", template=TEMPLATE)
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["wake"], recorder, max_sleep_s=120)
    thread = threading.Thread(target=pump.run)
    thread.start()
    try:
        time.sleep(0.5)  # let it fall asleep until tomorrow (capped at 120 s)
        repeat.register("wake", "soon", every="1s", template=TEMPLATE)
        deadline = time.monotonic() + 30
        while "soon" not in recorder.names() and time.monotonic() < deadline:
            time.sleep(0.05)
        # Without the wake-up it would sleep 120 s; the 30 s bound is generous for a busy CI.
        assert "soon" in recorder.names()
    finally:
        pump.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_embedded_server_dies_with_a_killed_parent() -> None:
    script = textwrap.dedent("""
        import os, signal
        from emq_bridge.embedded import EmbeddedServer
        server = EmbeddedServer().start()
        print(server.process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    parent = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    pid = int(parent.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split()[2] == "Z":  # a zombie awaiting its reaper is dead
                return
        time.sleep(0.05)
    pytest.fail(f"embedded server {pid} outlived its killed parent")


def test_a_trigger_in_the_millisecond_of_a_slot_is_a_distinct_occurrence(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    triggered = any_repeat.trigger("reports", "digest", now_ms=T0 + HOUR)
    recorder = RecordingDispatcher()
    Pump(any_repeat, ["reports"], recorder).run_once(now_ms=T0 + HOUR)
    ids = sorted(o.id for o in recorder.occurrences)
    assert ids == sorted(
        [triggered, occurrence_id(any_repeat.prefix, "reports", "digest", T0 + HOUR)]
    )
    assert len(set(ids)) == 2


def test_a_template_is_read_only_to_dispatchers_and_copies_of_it_are_changeable(
    any_repeat: Repeat,
) -> None:
    any_repeat.register(
        "reports",
        "digest",
        every="1s",
        template={"task": "t", "args": [1], "kwargs": {"n": 1}},
        now_ms=T0,
    )

    class Meddler:
        def __init__(self) -> None:
            self.seen: list[int] = []

        def dispatch(self, occurrence: Occurrence) -> None:
            self.seen.append(occurrence.template["kwargs"]["n"])
            with pytest.raises(TypeError, match="read-only"):
                occurrence.template["kwargs"]["n"] = 99  # type: ignore[index]
            with pytest.raises(TypeError, match="read-only"):
                occurrence.template["args"].append(2)
            copy = copy_module.deepcopy(occurrence.template)  # a plain, changeable copy
            copy["kwargs"]["n"] = 99
            copy["args"].append(2)
            assert json.loads(json.dumps(occurrence.template)) == {
                "task": "t",
                "args": [1],
                "kwargs": {"n": 1},
            }

    meddler = Meddler()
    pump = Pump(any_repeat, ["reports"], meddler)
    for step in range(1, 4):
        tick = pump.run_once(now_ms=T0 + step * 1000)
        assert len(tick.dispatched) == 1
    assert meddler.seen == [1, 1, 1]


def test_a_burst_starts_with_a_small_batch_so_its_first_message_leaves_early(
    repeat: Repeat,
) -> None:
    from emq_bridge.pump import FIRST_BATCH

    sizes: list[int] = []

    class Batches:
        def dispatch(self, occurrence: Occurrence) -> None:
            raise AssertionError("the pump prefers dispatch_batch")

        def dispatch_batch(self, occurrences: Sequence[Occurrence]) -> list[None]:
            sizes.append(len(occurrences))
            return [None] * len(occurrences)

    repeat.upsert_many(
        [("burst", f"job-{i}", define(every="1h", template={"task": "t"})) for i in range(1000)],
        now_ms=T0,
    )
    tick = Pump(repeat, ["burst"], Batches(), batch_size=500).run_once(now_ms=T0 + HOUR)
    assert len({o.name for o in tick.dispatched}) == 1000
    assert FIRST_BATCH == 32
    assert sizes == [32, 128, 500, 1000 - 32 - 128 - 500]


def test_a_firing_given_another_template_keeps_every_other_field() -> None:
    """The decode of a distinct template reuses its registration's shape (`with_template`,
    built field by field for speed): it must carry every field `replace` would."""
    from dataclasses import fields, replace

    from emq_bridge.cadence import Every
    from emq_bridge.pump import _Firing

    values = {
        "cadence": Every(60_000),
        "misfire": "all",
        "template": {"task": "a"},
        "overlap": "skip",
        "catchup_window_ms": 5_000,
        "catchup_max": 3,
        "end_ms": 1_900_000_000_000,
    }
    assert [f.name for f in fields(_Firing)] == list(values)
    firing = _Firing(**values)  # type: ignore[arg-type]
    assert firing.with_template({"task": "b"}) == replace(firing, template={"task": "b"})


def test_a_pump_given_one_queue_name_as_a_string_says_so(repeat: Repeat) -> None:
    # A str is an Iterable[str] (mypy accepts it): each letter would have been a queue.
    with pytest.raises(TypeError, match=r"not a string: \['reports'\]"):
        Pump(repeat, "reports", RecordingDispatcher())  # type: ignore[arg-type]
    assert Pump(repeat, ["reports"], RecordingDispatcher()).queues == ("reports",)
