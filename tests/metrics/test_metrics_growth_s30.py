"""A long-lived process's metrics stay bounded: rebuilt pumps, short-lived queues, schedules
left to another app's pumps.

Found by a leak probe (session 30): every `install(pump)` on one registry added a source to its
registrations collector, never removed (closed Repeats kept alive, and reopened by each
scrape); the outcome series of every queue a worker ever reported on were kept forever; and a
pump remembered every registration it left to another app's pumps.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from celery.schedules import schedule
from prometheus_client import CollectorRegistry, generate_latest

import emq_bridge.pump
from emq_bridge import Pump, Repeat
from emq_bridge.cadence import Cadence
from emq_bridge.celery.entries import convert_schedule
from emq_bridge.definition import Definition
from emq_bridge.errors import ConfigError
from emq_bridge.metrics import (
    RegistrationsCollector,
    _collectors,
    install,
    install_outcomes,
    uninstall_outcomes,
)
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000
TEMPLATE = {"task": "reports.digest"}


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    found = CollectorRegistry()
    yield found
    uninstall_outcomes(found)


def series(registry: CollectorRegistry, name: str) -> int:
    """How many series of `name` a scrape shows."""
    text = generate_latest(registry).decode()
    return sum(1 for line in text.splitlines() if line.startswith(name + "{"))


def collector_of(registry: CollectorRegistry) -> RegistrationsCollector:
    found, collector = _collectors[id(registry)]
    assert found is registry
    return collector


def connected_names(repeat: Repeat) -> set[str]:
    """The client names of the connections the server has open."""
    return {str(each["name"]) for each in repeat.client.client_list()}


def test_a_rebuilt_pump_replaces_the_old_one_in_the_registrations_collector(
    redis_url: str, prefix: str, registry: CollectorRegistry
) -> None:
    admin = Repeat.from_url(redis_url, prefix)
    admin.register("svc", "job", every="1m", template=TEMPLATE)
    closed: list[Repeat] = []
    for number in range(5):  # a supervisor loop: build, run, close, build again
        repeat = Repeat.from_url(f"{redis_url}?client_name={prefix}-{number}", prefix)
        pump = Pump(repeat, ["svc"], RecordingDispatcher())
        install(pump, registry, outcomes=False)
        pump.run_once()
        repeat.close()
        closed.append(repeat)  # still referenced: only the replacement can drop it
    collector = collector_of(registry)
    assert len(collector.sources) == 1
    assert collector.sources[0][0] is closed[-1]
    assert series(registry, "emq_bridge_registrations") == 4  # one queue, four states
    # A scrape read the newest Repeat only: the closed older ones were not reopened.
    assert {name for name in connected_names(admin) if name.startswith(prefix)} == {f"{prefix}-4"}


def test_a_pump_that_is_gone_drops_out_of_the_registrations_collector(
    repeat: Repeat, redis_url: str, prefix: str, registry: CollectorRegistry
) -> None:
    repeat.register("kept", "x", every="1m", template=TEMPLATE)
    repeat.register("old", "y", every="1m", template=TEMPLATE)
    kept = Pump(repeat, ["kept"], RecordingDispatcher())
    install(kept, registry, outcomes=False)
    for queues in (["old"], ["old", "other"], ["other"]):  # reloads with other queues
        rebuilt = Repeat.from_url(redis_url, prefix)
        install(Pump(rebuilt, queues, RecordingDispatcher()), registry, outcomes=False)
        gone = weakref.ref(rebuilt)
        del rebuilt
        gc.collect()
        assert gone() is None  # the collector did not keep it alive
    collector = collector_of(registry)
    assert collector.sources == [(repeat, ("kept",))]
    assert series(registry, "emq_bridge_registrations") == 4  # "kept" only


def test_a_collector_built_by_hand_keeps_its_repeat(
    redis_url: str, prefix: str, registry: CollectorRegistry
) -> None:
    Repeat.from_url(redis_url, prefix).register("mq", "x", every="1m", template=TEMPLATE)
    registry.register(RegistrationsCollector(Repeat.from_url(redis_url, prefix), ["mq"]))
    gc.collect()
    assert series(registry, "emq_bridge_registrations") == 4


def report_one(repeat: Repeat, queue: str, number: int) -> None:
    occurrence = {"id": f"o-{number}", "queue": queue, "name": "job", "due_ms": T0}
    repeat.started(occurrence)
    repeat.finished(occurrence, ok=False, error="boom")


def test_outcome_series_are_kept_for_the_most_recent_queues_only(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    metrics = install_outcomes(registry, max_queues=3)
    for number in range(20):  # per-tenant queues that come and go
        report_one(repeat, f"tenant-{number}", number)
    report_one(repeat, "tenant-17", 100)  # the least recent of the last three, reported again
    report_one(repeat, "tenant-20", 101)
    assert metrics.queues == ["tenant-19", "tenant-17", "tenant-20"]
    assert series(registry, "emq_bridge_outcomes_total") == 3 * 2  # started, failed
    assert series(registry, "emq_bridge_run_lag_seconds_count") == 3

    # A queue kept goes on counting; one dropped and back starts again (a counter reset).
    def started(queue: str) -> float | None:
        labels = {"queue": queue, "status": "started"}
        return registry.get_sample_value("emq_bridge_outcomes_total", labels)

    assert started("tenant-17") == 2
    assert started("tenant-18") is None
    report_one(repeat, "tenant-0", 102)
    assert started("tenant-0") == 1  # not 2: its series was removed with it
    assert metrics.queues == ["tenant-17", "tenant-20", "tenant-0"]


def test_the_default_bound_is_generous_and_a_bad_one_is_refused(
    registry: CollectorRegistry,
) -> None:
    assert install_outcomes(registry).max_queues == 1_000
    with pytest.raises(ConfigError, match="max_queues must be a positive int, got 0"):
        install_outcomes(registry, max_queues=0)


APP = Celery("growth", set_as_current=False)


def test_the_registrations_left_to_another_apps_pumps_are_remembered_up_to_a_bound(
    repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emq_bridge.pump, "DECODED_CACHE_SIZE", 4)
    elsewhere = convert_schedule(schedule(timedelta(seconds=9), relative=True), APP, "rel")
    entries = [("q", f"rel-{n}", Definition(elsewhere, {"task": "t"})) for n in range(10)]
    repeat.upsert_many(entries, now_ms=T0)

    def stored(queue: str, name: str, cadence: Cadence) -> Cadence:
        return cadence  # this app has none of them: each is left to another app's pumps

    pump = Pump(repeat, ["q"], RecordingDispatcher(), resolve_cadence=stored)
    due = min(r.next_run_ms or 0 for r in repeat.list("q"))
    pump.run_once(due + 60_000)
    assert 0 < len(pump._not_here) <= 4


def test_by_default_a_process_keeps_the_outcome_series_of_a_thousand_queues(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    install_outcomes(registry)
    for number in range(1_010):  # each reported on once, then gone
        occurrence = {"id": f"o-{number}", "queue": f"t-{number}", "name": "job", "due_ms": T0}
        repeat.finished(occurrence, ok=False, error="boom")
    assert series(registry, "emq_bridge_outcomes_total") == 1_000
    failed = {"queue": "t-9", "status": "failed"}
    assert registry.get_sample_value("emq_bridge_outcomes_total", failed) is None
    assert registry.get_sample_value("emq_bridge_outcomes_total", {**failed, "queue": "t-10"}) == 1
